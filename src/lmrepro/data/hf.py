"""Hugging Face text: one split of a dataset's text column as a single UTF-8 byte stream.

:func:`fetch_hf_text` reads through ``datasets`` from a hub id or a local copy (a
``save_to_disk`` directory, a directory of data files, or a single data file), joins the
documents with the spec's separator, optionally stops at a byte budget on a document boundary,
and writes the stream with a JSON sidecar under ``cache_dir/hf/<source>/``. ``datasets`` is
imported only when a stream has to be (re)built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tqdm.auto import tqdm

from lmrepro.data.download import cache_problem
from lmrepro.data.errors import SourceUnavailableError
from lmrepro.data.spec import HfSpec
from lmrepro.errors import ParameterError, check
from lmrepro.io import atomic_open, atomic_write_json

__all__ = ["fetch_hf_text", "hf_cache_paths", "local_fingerprint"]

log = logging.getLogger(__name__)

_DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text",
                       ".csv": "csv", ".arrow": "arrow"}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "source"


def local_fingerprint(source: str) -> list[list[Any]] | None:
    """(relative path, size, mtime_ns) of every file of a local source; None for a hub id.

    Part of the cache key, so editing or replacing a local copy invalidates the cached text.
    """
    path = Path(source).expanduser()
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [[str(p.relative_to(path)) if p != path else p.name, p.stat().st_size,
             p.stat().st_mtime_ns] for p in files]


def hf_cache_paths(spec: HfSpec, split: str, byte_budget: int | None,
                   cache_dir: str | os.PathLike) -> tuple[Path, Path]:
    """The cached text file and its sidecar for one split of ``spec`` at ``byte_budget``.

    Keyed by everything that changes the bytes (and, for a local copy, its files' fingerprint).
    """
    key = json.dumps([spec.source, spec.config_name, spec.revision, split, spec.text_field,
                      byte_budget, spec.separator, local_fingerprint(spec.source)])
    tag = hashlib.sha256(key.encode()).hexdigest()[:10]
    name = f"{_slug(split)}-{tag}"
    root = Path(cache_dir) / "hf" / _slug(spec.source)
    return root / f"{name}.txt", root / f"{name}.json"


def fetch_hf_text(spec: HfSpec, *, split: str, byte_budget: int | None = None,
                  cache_dir: str | os.PathLike, corpus: str | None = None,
                  param_prefix: str = "") -> Path:
    """Write ``split`` of ``spec.source`` as a single UTF-8 byte stream; return its path.

    ``spec.source`` is a hub id (``roneneldan/TinyStories``) or a local copy: a directory
    written by ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``, a directory of data files
    that ``datasets.load_dataset`` reads (json/jsonl/parquet/csv/txt; split names come from the
    file names, e.g. ``train.jsonl``/``validation.jsonl``), or one such data file (split
    ``train``). ``spec.revision`` pins a hub dataset to a commit/tag.

    Rule: documents are taken in dataset order; empty (whitespace-only) documents are skipped;
    the others are encoded as UTF-8 and joined with ``spec.separator`` (default a blank line,
    ``"\\n\\n"``), with no separator after the last. With ``byte_budget`` the stream stops before
    the first document that would push it past the budget (a document boundary), so it is at
    most ``byte_budget`` bytes and only the documents needed are read (``spec.streaming`` for
    large hub datasets).

    The result is cached (:func:`hf_cache_paths`) with a JSON sidecar (source, split, n_docs,
    bytes, sha256, ...); a cached file is re-verified on every call and rebuilt when it does not
    match its sidecar. Messages name the keys under ``param_prefix`` (``data.corpora.<name>``).
    """
    corpus = corpus or spec.source
    pfx = f"{param_prefix}." if param_prefix else ""
    check(byte_budget is None or byte_budget > 0, f"{pfx}byte_budget", byte_budget,
          "must be a positive integer (bytes) or null")
    out, meta_path = hf_cache_paths(spec, split, byte_budget, cache_dir)
    if out.exists():
        problem = cache_problem(out, meta_path, {})
        if problem is None:
            log.info("%s: using cached %s split %r at %s (verified)", corpus, spec.source, split,
                     out)
            return out
        log.warning("%s: cached %s is not usable (%s); fetching it again", corpus, out, problem)
        out.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)

    docs, resolved = _open_text_docs(spec, split=split, cache_dir=cache_dir, corpus=corpus,
                                     pfx=pfx)
    log.info("%s: writing %s split %r (%s) -> %s", corpus, spec.source, split,
             f"budget {byte_budget} bytes" if byte_budget else "all documents", out)
    with atomic_open(out, "wb") as fh, tqdm(total=byte_budget, unit="B", unit_scale=True,
                                            desc=f"{corpus}:{split}", disable=None) as bar:
        stats = _write_stream(docs, fh, spec.separator.encode("utf-8"), byte_budget, bar)
        if stats["n_docs"] == 0:
            stopped = stats["truncated_by_budget"]
            raise ParameterError(
                f"{pfx}byte_budget" if stopped else f"{pfx}source",
                byte_budget if stopped else spec.source,
                f"{corpus}: split {split!r} yielded no documents"
                + (" (the first document is larger than the budget)" if stopped
                   else " with non-empty text"))
    atomic_write_json(meta_path, {
        "corpus": corpus, "source": spec.source, "resolved": resolved,
        "config_name": spec.config_name, "revision": spec.revision, "split": split,
        "text_field": spec.text_field, "byte_budget": byte_budget, "separator": spec.separator,
        **stats,
    })
    log.info("%s: %d documents, %d bytes -> %s", corpus, stats["n_docs"], stats["bytes"], out)
    return out


def _write_stream(docs: Iterable[str], fh: BinaryIO, sep: bytes, byte_budget: int | None,
                  bar: Any) -> dict[str, Any]:
    """Write the non-empty documents joined by ``sep`` up to ``byte_budget``; the sidecar's
    counts: ``n_docs``, ``n_empty_skipped``, ``truncated_by_budget``, ``bytes``, ``sha256``."""
    h = hashlib.sha256()
    n_bytes = n_docs = n_empty = 0
    stopped = False
    for text in docs:
        if not text.strip():
            n_empty += 1
            continue
        data = text.encode("utf-8", errors="surrogatepass")
        add = len(data) + (len(sep) if n_docs else 0)
        if byte_budget is not None and n_bytes + add > byte_budget:
            stopped = True
            break
        if n_docs:
            fh.write(sep)
            h.update(sep)
        fh.write(data)
        h.update(data)
        n_bytes += add
        n_docs += 1
        bar.update(add)
    return {"n_docs": n_docs, "n_empty_skipped": n_empty, "truncated_by_budget": stopped,
            "bytes": n_bytes, "sha256": h.hexdigest()}


def _open_text_docs(spec: HfSpec, *, split: str, cache_dir: str | os.PathLike, corpus: str,
                    pfx: str) -> tuple[Iterator[str], str]:
    """An iterator over the text column of one split, and a description of what was opened."""
    import datasets  # heavy import, only when needed

    source = spec.source
    path = Path(source).expanduser()
    hf_cache = str(Path(cache_dir) / "hf_datasets")
    if path.exists():
        ds, resolved = _open_local(path, split=split, streaming=spec.streaming,
                                   config_name=spec.config_name, hf_cache=hf_cache, pfx=pfx)
    else:
        if _looks_like_path(source):
            raise SourceUnavailableError(
                f"{corpus}: local dataset path {source} does not exist. "
                f"Set {pfx}source to a hub id or to an existing local copy "
                "(a save_to_disk directory or a directory of json/parquet/txt files).")
        log.info("%s: loading hub dataset %s (config %s, revision %s, split %r, streaming=%s)",
                 corpus, source, spec.config_name, spec.revision, split, spec.streaming)
        try:
            ds = datasets.load_dataset(source, spec.config_name, split=split,
                                       streaming=spec.streaming, cache_dir=hf_cache,
                                       revision=spec.revision)
        except ValueError as err:
            if "split" in str(err).lower() and "unknown" in str(err).lower():
                raise ParameterError(f"{pfx}split", split,
                                     f"{corpus}: not a split of {source} ({err})") from err
            raise _hub_unavailable(corpus, source, pfx, err) from err
        except Exception as err:  # noqa: BLE001 -- network, auth, not-found, offline mode
            raise _hub_unavailable(corpus, source, pfx, err) from err
        resolved = f"hub:{source}"
    columns = list(ds.column_names or []) if getattr(ds, "column_names", None) else None
    if columns is not None and spec.text_field not in columns:
        raise ParameterError(f"{pfx}text_field", spec.text_field,
                             f"{corpus}: no such column in {source} split {split!r} "
                             f"(columns: {columns})")
    return _iter_text(ds, spec.text_field, corpus, source, pfx), resolved


def _looks_like_path(source: str) -> bool:
    """A hub id is ``name`` or ``owner/name``; anything else that does not exist is a path."""
    return (source.startswith((".", "/", "~")) or source.count("/") > 1 or "\\" in source
            or Path(source).suffix.lower() in _DATA_FILE_BUILDERS)


def _hub_unavailable(corpus: str, source: str, pfx: str, err: BaseException
                     ) -> SourceUnavailableError:
    return SourceUnavailableError(
        f"{corpus}: cannot load {source!r} from the Hugging Face hub "
        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). "
        f"To use a local copy, set {pfx}source to a directory written by "
        "Dataset(Dict).save_to_disk, a directory of json/jsonl/parquet/txt files "
        "(train.jsonl, validation.jsonl, ...), or one such file.")


def _open_local(path: Path, *, split: str, streaming: bool, config_name: str | None,
                hf_cache: str, pfx: str) -> tuple[Any, str]:
    import datasets

    if path.is_dir() and ((path / "dataset_dict.json").exists()
                          or (path / "state.json").exists()):
        log.info("loading saved dataset from %s", path)
        obj = datasets.load_from_disk(str(path))
        if isinstance(obj, datasets.DatasetDict):
            if split not in obj:
                raise ParameterError(f"{pfx}split", split,
                                     f"not a split of {path} (splits: {sorted(obj)})")
            ds = obj[split]
        else:
            saved = str(obj.split) if obj.split is not None else None
            if (saved or "train") != split:
                raise ParameterError(f"{pfx}split", split,
                                     f"{path} holds a single dataset of split "
                                     f"{saved or 'train'!r}")
            ds = obj
        if streaming:
            ds = ds.to_iterable_dataset()
        return ds, f"save_to_disk:{path}"
    if path.is_file():
        builder = _DATA_FILE_BUILDERS.get(path.suffix.lower())
        check(builder is not None, f"{pfx}source", str(path),
              f"a local data file must end in one of {sorted(_DATA_FILE_BUILDERS)}")
        check(split == "train", f"{pfx}split", split,
              f"a single data file ({path.name}) is split 'train'; use a directory with one "
              "file per split for other splits")
        ds = datasets.load_dataset(builder, data_files={"train": str(path)}, split="train",
                                   streaming=streaming, cache_dir=hf_cache)
        return ds, f"file:{path}"
    log.info("loading data files from directory %s", path)
    try:
        ds = datasets.load_dataset(str(path), config_name, split=split, streaming=streaming,
                                   cache_dir=hf_cache)
    except ValueError as err:
        raise ParameterError(f"{pfx}split", split,
                             f"cannot read split {split!r} from {path}: {err}") from err
    except FileNotFoundError as err:
        raise ParameterError(f"{pfx}source", str(path),
                             f"holds no data files that datasets can read ({err})") from err
    return ds, f"data_files:{path}"


def _iter_text(ds: Iterable[dict], text_field: str, corpus: str, source: str,
               pfx: str) -> Iterator[str]:
    for i, row in enumerate(ds):
        if text_field not in row:
            raise ParameterError(f"{pfx}text_field", text_field,
                                 f"{corpus}: row {i} of {source} has no such field "
                                 f"(fields: {sorted(row)})")
        value = row[text_field]
        if value is None:
            continue
        if not isinstance(value, str):
            raise ParameterError(f"{pfx}text_field", text_field,
                                 f"{corpus}: row {i} holds {type(value).__name__}, not text")
        yield value
