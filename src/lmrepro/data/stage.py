"""The data stages of the pipeline, as functions of the validated ``data:`` section.

:func:`fetch_all` and :func:`prepare_all` are the ``fetch`` and ``prepare`` stages (their
notebooks call them); :func:`load_splits` and :func:`data_identity` are what a training stage
reads back: the verified splits, and the manifest whose change invalidates earlier runs.
:func:`prepare_from_spec` is one corpus of :func:`prepare_all` (and of ``lmrepro prepare``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.data.fetch import fetch_corpus
from lmrepro.data.prepare import MANIFEST, is_prepared, load_split, prepare_corpus, read_manifest
from lmrepro.data.spec import CorpusSpec, DataConfig, corpus_key
from lmrepro.io import atomic_write_json

__all__ = ["data_identity", "fetch_all", "load_splits", "prepare_all", "prepare_from_spec"]

log = logging.getLogger(__name__)


def fetch_all(data: DataConfig) -> dict[str, dict[str, Any]]:
    """Fetch (or find in cache) every corpus in ``data.use``; return what each fetched.

    The same record is written to ``raw_dir/fetched.json`` (which also makes ``raw_dir`` exist
    for DVC).
    """
    out = {name: fetch_corpus(name, data.corpora[name], data.raw_dir) for name in data.use}
    atomic_write_json(Path(data.raw_dir) / "fetched.json", out)
    return out


def prepare_all(data: DataConfig) -> dict[str, Path]:
    """Prepare every corpus in ``data.use`` and score its n-gram floor
    (:func:`lmrepro.data.ngram.corpus_floor`, kept beside the splits); return its prepared
    directory."""
    from lmrepro.data.ngram import corpus_floor

    out = {name: prepare_from_spec(name, data.corpora[name], data.raw_dir, data.prepared_dir)
           for name in data.use}
    for path in out.values():
        corpus_floor(path)
    return out


def prepare_from_spec(name: str, spec: CorpusSpec, cache_dir: str | os.PathLike,
                      prepared_root: str | os.PathLike, *, force: bool = False) -> Path:
    """Fetch and prepare corpus ``name``; return ``prepared_root/<name>``.

    The splits are written again only when the directory does not verify against a manifest
    made from the same spec and the same raw bytes (or with ``force``).
    """
    fetched = fetch_corpus(name, spec, cache_dir)
    out = Path(prepared_root) / name
    source = {"corpus": name, "spec": fetched["spec"], "raw_sha256": fetched["sha256"]}
    if not force and is_prepared(out, source):
        log.info("prepare: %s is up to date (verified against %s)", out, MANIFEST)
        return out
    files = fetched["files"]
    if len(files) == 1 and files[0][0] == "all":
        prepare_corpus(files[0][1], out, split_bytes=spec.split_bytes,
                       split_fractions=spec.split_fractions, source=source,
                       param_prefix=corpus_key(name))
    else:
        prepare_corpus([(s, p) for s, p in files], out, source=source,
                       param_prefix=corpus_key(name))
    log.info("prepared %s -> %s", name, out)
    return out


def _corpus_dir(data: DataConfig | str | os.PathLike, corpus: str) -> Path:
    root = data.prepared_dir if isinstance(data, DataConfig) else data
    return Path(root) / corpus


def load_splits(data: DataConfig | str | os.PathLike, corpus: str
                ) -> tuple[np.memmap, np.memmap]:
    """``(train, val)`` of a prepared corpus as read-only uint8 memmaps, checksums verified.

    ``data`` is the ``data:`` section or the prepared root directory.
    """
    root = _corpus_dir(data, corpus)
    return load_split(root, "train"), load_split(root, "val")


def data_identity(prepared_dir: DataConfig | str | os.PathLike, corpus: str) -> dict[str, Any]:
    """The prepared corpus's manifest (checksums of every split): a training stage stores it
    and starts afresh when it changes."""
    return read_manifest(_corpus_dir(prepared_dir, corpus))
