"""The n-gram floor of a prepared corpus: what a byte model must beat before its quality says
anything about a training method.

Two count tables built from ``train.bin`` and scored in bits per byte on the validation and test
splits (every byte from the third on, so both see the same positions):

* **bigram, add-k** (Lidstone): ``P(c | b) = (N(b c) + k) / (N(b) + 256 k)``;
* **trigram, simply interpolated** (Jelinek & Mercer 1980; Chen & Goodman 1999, sec. 2.3):
  ``P(c | a b) = l3 N(a b c) / N(a b) + l2 N(b c) / N(b) + l1 N(c) / N + l0 / 256``, a maximum
  likelihood term whose context was never seen in training counting as 0 and its weight going
  to the uniform term.

``k`` and the weights ``(l3, l2, l1, l0)`` are chosen on the validation split from a small grid
(:data:`ADD_K`, :data:`WEIGHTS`), so the validation figure is slightly optimistic and the test
figure is the honest one; both are reported. A quality verdict counts as testable only when the
dense baseline ends clearly below the trigram floor (:data:`TESTABLE_MARGIN`).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.io import atomic_write_json, read_json

FLOOR_FILE = "ngram_floor.json"
ADD_K = (0.01, 0.03, 0.1, 0.3, 1.0)
#: candidate (l3, l2, l1) weights; l0 = 1 - l3 - l2 - l1 (at least 0.01)
WEIGHTS = tuple(w for w in itertools.product((0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95),
                                             (0.02, 0.03, 0.05, 0.1, 0.2, 0.3),
                                             (0.005, 0.01, 0.02, 0.05))
                if sum(w) <= 0.99)
#: a verdict is testable when the dense baseline ends this far below the trigram floor (10 %)
TESTABLE_MARGIN = 0.10


def counts(train: np.ndarray) -> dict[str, np.ndarray]:
    """Unigram, bigram and trigram counts of a uint8 sequence (flat arrays: 256, 256^2, 256^3)."""
    x = np.asarray(train, dtype=np.int64)
    return {"uni": np.bincount(x, minlength=256),
            "bi": np.bincount(x[:-1] * 256 + x[1:], minlength=256 ** 2),
            "tri": np.bincount((x[:-2] * 256 + x[1:-1]) * 256 + x[2:], minlength=256 ** 3)}


def _terms(c: dict[str, np.ndarray], seq: np.ndarray) -> dict[str, np.ndarray]:
    """Per scored position (the third byte on): the ML probabilities and the bigram counts."""
    x = np.asarray(seq, dtype=np.int64)
    a, b, t = x[:-2], x[1:-1], x[2:]
    n_ab = c["bi"][a * 256 + b]
    n_abc = c["tri"][(a * 256 + b) * 256 + t]
    n_b = c["uni"][b]
    n_bc = c["bi"][b * 256 + t]
    with np.errstate(divide="ignore", invalid="ignore"):
        p3 = np.where(n_ab > 0, n_abc / np.maximum(n_ab, 1), 0.0)
        p2 = np.where(n_b > 0, n_bc / np.maximum(n_b, 1), 0.0)
    return {"p3": p3, "p2": p2, "p1": c["uni"][t] / c["uni"].sum(), "seen3": n_ab > 0,
            "seen2": n_b > 0, "n_bc": n_bc.astype(float), "n_b": n_b.astype(float)}


def bigram_bpb(terms: dict[str, np.ndarray], k: float) -> float:
    """Bits per byte of the add-``k`` bigram table on the scored positions."""
    p = (terms["n_bc"] + k) / (terms["n_b"] + 256 * k)
    return float(-np.log2(p).mean())


def trigram_bpb(terms: dict[str, np.ndarray], weights: tuple[float, float, float]) -> float:
    """Bits per byte of the interpolated trigram table; an unseen context's weight goes to the
    uniform term."""
    l3, l2, l1 = weights
    l0 = 1.0 - l3 - l2 - l1
    w3 = np.where(terms["seen3"], l3, 0.0)
    w2 = np.where(terms["seen2"], l2, 0.0)
    p = w3 * terms["p3"] + w2 * terms["p2"] + l1 * terms["p1"] + (l0 + (l3 - w3) + (l2 - w2)) / 256
    return float(-np.log2(p).mean())


def floors(train: np.ndarray, val: np.ndarray, test: np.ndarray) -> dict[str, Any]:
    """Both tables' bits per byte on the validation and test splits, with the smoothing chosen
    on the validation split."""
    c = counts(train)
    tv, tt = _terms(c, val), _terms(c, test)
    k = min(ADD_K, key=lambda k: bigram_bpb(tv, k))
    w = min(WEIGHTS, key=lambda w: trigram_bpb(tv, w))
    return {
        "bigram": {"val": bigram_bpb(tv, k), "test": bigram_bpb(tt, k), "add_k": k},
        "trigram": {"val": trigram_bpb(tv, w), "test": trigram_bpb(tt, w),
                    "weights": {"l3": w[0], "l2": w[1], "l1": w[2],
                                "l0": round(1.0 - sum(w), 6)}},
        "smoothing": "bigram: add-k (Lidstone); trigram: Jelinek-Mercer interpolation of "
                     "trigram, bigram, unigram and uniform; k and the weights chosen on the "
                     "validation split",
        "train_bytes": int(len(train)), "scored_positions": {"val": int(len(val) - 2),
                                                             "test": int(len(test) - 2)},
    }


def corpus_floor(corpus_dir: str | Path, *, refresh: bool = False, write: bool = True
                 ) -> dict[str, Any]:
    """The floors of a prepared corpus, computed once and kept beside it (:data:`FLOOR_FILE`,
    keyed by the splits' checksums so a re-prepared corpus is scored again; ``write=False``:
    computed when missing but not stored, for readers of another stage's outputs)."""
    from lmrepro.data.prepare import load_split, read_manifest

    corpus_dir = Path(corpus_dir)
    manifest = read_manifest(corpus_dir)
    key = {s: manifest["files"][s]["sha256"] for s in ("train", "val", "test")}
    path = corpus_dir / FLOOR_FILE
    if path.exists() and not refresh:
        cached = read_json(path)
        if cached.get("splits") == key:
            return cached
    out = {**floors(*(load_split(corpus_dir, s) for s in ("train", "val", "test"))),
           "splits": key}
    if write:
        atomic_write_json(path, out)
    return out


def testable(dense_bpb: float, trigram_bpb: float, margin: float = TESTABLE_MARGIN) -> bool:
    """Whether a dense baseline at ``dense_bpb`` is at least ``margin`` below the trigram floor."""
    return math.isfinite(dense_bpb) and dense_bpb <= (1.0 - margin) * trigram_bpb
