"""Prepared splits: ``train.bin``/``val.bin``/``test.bin`` (raw uint8 bytes) + ``manifest.json``.

A prepared directory holds the three split files, each the raw bytes of its part of the corpus
(one byte = one token, memory-mappable as ``uint8``), and ``manifest.json`` with the source, the
split rule, and the byte count and sha256 of every file. The manifest is written last and
removed first when a directory is re-prepared, so a directory with a manifest is complete.

:func:`load_split` re-verifies size and sha256 against the manifest on every read (sha256 of a
90 MB file takes about 0.3 s), so a damaged or swapped file is never silently used.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import lmrepro
from lmrepro.data.errors import IntegrityError
from lmrepro.errors import check
from lmrepro.io import atomic_open, atomic_write_json, read_json, sha256_file

__all__ = [
    "DEFAULT_SPLIT_BYTES", "DEFAULT_SPLIT_FRACTIONS", "FORMAT", "MANIFEST", "SPLITS",
    "SPLIT_BYTES_RULE", "SPLIT_FRACTIONS_RULE", "check_split", "is_prepared", "load_split",
    "prepare_corpus", "read_manifest", "split_sizes_from_fractions", "valid_split_bytes",
    "valid_split_fractions", "verify_file",
]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
FORMAT = "lmrepro.prepared/1"
DEFAULT_SPLIT_BYTES = (90_000_000, 5_000_000, 5_000_000)
DEFAULT_SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
SPLIT_BYTES_RULE = "must be three positive integers (train, val, test bytes)"
SPLIT_FRACTIONS_RULE = "must be three positive numbers (train, val, test) summing to 1"
_CHUNK = 1 << 22


def check_split(split: str, name: str = "split") -> str:
    """``split`` must be one of train/val/test."""
    check(split in SPLITS, name, split, f"must be one of {list(SPLITS)}")
    return split


def valid_split_bytes(value: Any) -> bool:
    """Three positive integers: the train, val and test byte counts."""
    return (isinstance(value, (list, tuple)) and len(value) == 3
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in value))


def valid_split_fractions(value: Any) -> bool:
    """Three positive numbers summing to 1: the train, val and test shares."""
    return (isinstance(value, (list, tuple)) and len(value) == 3
            and all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0
                    for f in value)
            and abs(sum(value) - 1.0) < 1e-9)


def split_sizes_from_fractions(n_bytes: int, fractions: Sequence[float],
                               name: str = "split_fractions") -> tuple[int, int, int]:
    """Byte counts for train/val/test: ``floor(f * n)`` for train and val, the rest to test."""
    check(valid_split_fractions(fractions), name, fractions, SPLIT_FRACTIONS_RULE)
    n_train = math.floor(fractions[0] * n_bytes)
    n_val = math.floor(fractions[1] * n_bytes)
    return n_train, n_val, n_bytes - n_train - n_val


def prepare_corpus(raw: str | os.PathLike | Sequence[tuple[str, str | os.PathLike]],
                   out_dir: str | os.PathLike, *,
                   split_bytes: Sequence[int] | None = None,
                   split_fractions: Sequence[float] | None = None,
                   source: dict[str, Any] | None = None,
                   param_prefix: str = "") -> dict[str, Any]:
    """Write the split files and the manifest into ``out_dir``; return the manifest.

    ``raw`` is either one file, cut in order into train/val/test by ``split_bytes`` (the first
    ``sum(split_bytes)`` bytes are used; enwik8: 90M/5M/5M) or ``split_fractions`` (train and val
    get ``floor(f * n)`` bytes, test the rest; default 0.9/0.05/0.05), or a list of
    ``(split, path)`` pairs with one file per split. In the list form ``train`` and ``val`` are
    required; without ``test`` the val file is cut in two: val = its first ``n // 2`` bytes,
    test = the rest. Cuts are at byte positions (as for enwik8), not document boundaries.
    """
    pfx = f"{param_prefix}." if param_prefix else ""
    check(split_bytes is None or split_fractions is None, f"{pfx}split_bytes", split_bytes,
          "give split_bytes or split_fractions, not both")
    if isinstance(raw, (str, os.PathLike)):
        plan, rule = _plan_one_file(_existing(raw, "raw_path"), split_bytes, split_fractions, pfx)
    else:
        check(split_bytes is None and split_fractions is None, f"{pfx}split_fractions",
              split_fractions if split_fractions is not None else split_bytes,
              "must be unset when each split comes from its own file")
        plan, rule = _plan_files(list(raw))
    for split, (_, _, size) in plan.items():
        check(size > 0, f"{pfx}split", split, "would be empty; the corpus is too small for the "
                                               "split rule")
    return _write_splits(plan, rule, Path(out_dir), source)


#: split -> (file, offset, length) of its bytes
Plan = dict[str, tuple[Path, int, int]]


def _plan_one_file(path: Path, split_bytes: Sequence[int] | None,
                   split_fractions: Sequence[float] | None, pfx: str
                   ) -> tuple[Plan, dict[str, Any]]:
    """One file cut in order into train/val/test, and the rule recorded in the manifest."""
    n = path.stat().st_size
    if split_bytes is not None:
        check(valid_split_bytes(split_bytes), f"{pfx}split_bytes", split_bytes,
              SPLIT_BYTES_RULE)
        check(sum(split_bytes) <= n, f"{pfx}split_bytes", list(split_bytes),
              f"needs {sum(split_bytes)} bytes but {path} has {n}")
        sizes = tuple(split_bytes)
        rule: dict[str, Any] = {"kind": "bytes", "split_bytes": list(split_bytes)}
    else:
        fractions = (tuple(split_fractions) if split_fractions is not None
                     else DEFAULT_SPLIT_FRACTIONS)
        sizes = split_sizes_from_fractions(n, fractions, f"{pfx}split_fractions")
        rule = {"kind": "fractions", "split_fractions": list(fractions),
                "note": "train, val = floor(f*n); test = the rest"}
    plan: Plan = {}
    offset = 0
    for split, size in zip(SPLITS, sizes):
        plan[split] = (path, offset, size)
        offset += size
    return plan, rule


def _plan_files(pairs: list[Any]) -> tuple[Plan, dict[str, Any]]:
    """One file per split from ``(split, path)`` pairs (without ``test``: the val file is cut in
    two), and the rule recorded in the manifest."""
    files: dict[str, Path] = {}
    for i, item in enumerate(pairs):
        check(isinstance(item, (tuple, list)) and len(item) == 2, f"raw[{i}]", item,
              "must be a (split, path) pair")
        split, p = item
        check_split(split, f"raw[{i}].split")
        check(split not in files, f"raw[{i}].split", split, "is given twice")
        files[split] = _existing(p, f"raw[{i}].path")
    for need in ("train", "val"):
        check(need in files, "raw", [s for s, _ in pairs],
              f"must include a {need!r} file (and optionally 'test')")
    plan: Plan = {"train": (files["train"], 0, files["train"].stat().st_size)}
    n_val_file = files["val"].stat().st_size
    if "test" in files:
        plan["val"] = (files["val"], 0, n_val_file)
        plan["test"] = (files["test"], 0, files["test"].stat().st_size)
        return plan, {"kind": "files", "note": "one file per split"}
    half = n_val_file // 2
    plan["val"] = (files["val"], 0, half)
    plan["test"] = (files["val"], half, n_val_file - half)
    return plan, {"kind": "files",
                  "note": "val = first n//2 bytes of the val file, test = the rest"}


def _write_splits(plan: Plan, rule: dict[str, Any], out: Path,
                  source: dict[str, Any] | None) -> dict[str, Any]:
    """Copy each split's bytes to ``out/<split>.bin``, then write the manifest (last: the folder
    is incomplete until it lands)."""
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        manifest_path.unlink()
    entries: dict[str, dict[str, Any]] = {}
    raws: dict[str, str] = {}
    for split, (path, offset, size) in plan.items():
        raws.setdefault(str(path), "")
        target = out / f"{split}.bin"
        log.info("prepare: %s bytes [%d, %d) -> %s", path, offset, offset + size, target)
        digest = _copy_range(path, offset, size, target)
        entries[split] = {"file": target.name, "bytes": size, "sha256": digest,
                          "source_file": str(path), "offset": offset}
    manifest = {
        "format": FORMAT, "dtype": "uint8", "source": source or {}, "split_rule": rule,
        "files": entries, "raw_files": {p: sha256_file(p) for p in raws},
        "created_by": f"lmrepro {lmrepro.__version__}",
    }
    atomic_write_json(manifest_path, manifest)
    log.info("prepare: wrote %s (%s)", manifest_path,
             ", ".join(f"{s}={e['bytes']}" for s, e in entries.items()))
    return manifest


def _existing(p: str | os.PathLike, name: str) -> Path:
    path = Path(p)
    check(path.is_file(), name, str(path), "must be an existing file (fetch the corpus first)")
    return path


def _copy_range(src: Path, offset: int, size: int, dest: Path) -> str:
    h = hashlib.sha256()
    left = size
    with open(src, "rb") as fin, atomic_open(dest, "wb") as fout:
        fin.seek(offset)
        while left:
            block = fin.read(min(_CHUNK, left))
            if not block:
                raise IntegrityError(f"prepare: {src} ended early at byte {offset + size - left}")
            fout.write(block)
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def read_manifest(prepared_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a prepared directory; a clear error if it is missing or unreadable."""
    path = Path(prepared_dir) / MANIFEST
    if not path.exists():
        raise IntegrityError(f"{path} is missing: {prepared_dir} is not a prepared corpus "
                             "(run `lmrepro prepare <corpus>` / the prepare stage)")
    try:
        manifest = read_json(path)
    except (OSError, ValueError) as err:
        raise IntegrityError(f"{path} is unreadable ({err}); prepare the corpus again") from err
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise IntegrityError(f"{path} is not a {FORMAT} manifest; prepare the corpus again")
    return manifest


def verify_file(prepared_dir: str | os.PathLike, split: str,
                manifest: dict[str, Any] | None = None) -> Path:
    """Check one split file's size and sha256 against the manifest; return its path."""
    check_split(split)
    manifest = manifest if manifest is not None else read_manifest(prepared_dir)
    entry = manifest["files"].get(split)
    if entry is None:
        raise IntegrityError(f"{Path(prepared_dir) / MANIFEST} has no entry for split {split!r}")
    path = Path(prepared_dir) / entry["file"]
    if not path.exists():
        raise IntegrityError(f"{path} is missing; prepare the corpus again")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise IntegrityError(f"{path} has {size} bytes, the manifest says {entry['bytes']}: "
                             "damaged or replaced; prepare the corpus again")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise IntegrityError(f"{path} has sha256 {digest}, the manifest says "
                             f"{entry['sha256']}: damaged or replaced; prepare the corpus again")
    return path


def is_prepared(prepared_dir: str | os.PathLike, source: dict[str, Any] | None = None) -> bool:
    """True when the directory verifies completely (and was made from ``source``, if given)."""
    try:
        manifest = read_manifest(prepared_dir)
        if source is not None and manifest.get("source") != source:
            return False
        for split in SPLITS:
            verify_file(prepared_dir, split, manifest)
    except IntegrityError as err:
        log.info("prepare: %s needs preparing (%s)", prepared_dir, err)
        return False
    return True


def load_split(prepared_dir: str | os.PathLike, split: str, verify: bool = True) -> np.memmap:
    """Memory-map one prepared split as read-only ``uint8``.

    With ``verify`` (the default) size and sha256 are checked against the manifest first and a
    mismatch raises :class:`IntegrityError` naming the file; a bad ``split`` raises
    :class:`ParameterError`.
    """
    check_split(split)
    manifest = read_manifest(prepared_dir)
    if verify:
        path = verify_file(prepared_dir, split, manifest)
    else:
        entry = manifest["files"].get(split)
        if entry is None:
            raise IntegrityError(f"{Path(prepared_dir) / MANIFEST} has no split {split!r}")
        path = Path(prepared_dir) / entry["file"]
        if not path.exists() or path.stat().st_size != entry["bytes"]:
            raise IntegrityError(f"{path} is missing or has the wrong size; prepare again")
    return np.memmap(path, dtype=np.uint8, mode="r")

