"""Checksummed, cached, atomic downloads of the raw corpora.

Two fetchers:

* :func:`fetch_enwik8` downloads ``enwik8.zip`` (or copies it from a local path / ``file://``
  URL), verifies the pinned sha256 of the zip, unzips the single member ``enwik8`` and verifies
  the size and sha256 of the unzipped bytes.
* :func:`fetch_hf_text` reads a text column through Hugging Face ``datasets`` from a hub id or a
  local copy (a ``save_to_disk`` directory, a directory of data files, or a single data file),
  joins the documents with :data:`DEFAULT_SEPARATOR` into one UTF-8 byte stream, optionally
  truncated on a document boundary at a byte budget, and writes it with a JSON sidecar.

Every file is written to a temporary sibling and renamed into place only once verified
(:mod:`lmrepro.io`), so a failed or interrupted download never leaves a half-written file that a
later run could mistake for a good one. A cached file is re-verified on every call; a damaged one
is logged, deleted and fetched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

from tqdm.auto import tqdm

from lmrepro.errors import ParameterError, check
from lmrepro.io import atomic_open, atomic_write_json, read_json, sha256_file

log = logging.getLogger(__name__)

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
#: sha256 of ``enwik8.zip`` as served by mattmahoney.net (36,445,475 bytes). Not published by the
#: author (he publishes MD5/SHA-1 of the unzipped file); corroborated by several independent
#: projects. Mirrors that re-pack the archive change it: set ``sha256: null`` for such a mirror
#: and rely on :data:`ENWIK8_RAW_SHA256` (the payload check), which does not depend on packing.
ENWIK8_ZIP_SHA256 = "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
ENWIK8_ZIP_BYTES = 36_445_475
#: sha256 of the unzipped 100,000,000-byte ``enwik8``.
ENWIK8_RAW_SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
#: Published by the author (http://mattmahoney.net/dc/textdata.html); documented, not checked.
ENWIK8_RAW_SHA1 = "57b8363b814821dc9d47aa4d41f58733519076b2"
ENWIK8_RAW_BYTES = 100_000_000

#: Separator between documents in the byte stream built by :func:`fetch_hf_text`: a blank line.
DEFAULT_SEPARATOR = "\n\n"

_CHUNK = 1 << 20
_USER_AGENT = "lmrepro-data-fetch/1 (+urllib)"


class DataError(RuntimeError):
    """A data file or source is unusable: unreachable, corrupt, or not what was pinned."""


class SourceUnavailableError(DataError):
    """The source (URL, hub id, local path) cannot be read."""


class IntegrityError(DataError):
    """A downloaded, cached or prepared file does not match its checksum, size or format."""


# ----------------------------------------------------------------------------------------------
# helpers


def _sha256_hex(value: Any, name: str) -> str | None:
    """Validate an optional sha256 hex digest parameter and return it lower-cased."""
    if value is None:
        return None
    check(isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value) is not None,
          name, value, "must be a 64-character hex sha256 digest or null")
    return value.lower()


def copy_hashed(src: BinaryIO, out: BinaryIO, h: "hashlib._Hash", progress: Any = None) -> int:
    """Copy ``src`` into ``out`` in chunks, feeding every chunk to ``h``; return the byte count."""
    n = 0
    for block in iter(lambda: src.read(_CHUNK), b""):
        out.write(block)
        h.update(block)
        n += len(block)
        if progress is not None:
            progress.update(len(block))
    return n


def _is_remote(url: str) -> bool:
    return urllib.parse.urlparse(url).scheme in ("http", "https")


def _local_path(url: str) -> Path:
    """``file:///x/y`` or a plain path -> Path."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    return Path(url).expanduser()


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _hint(param: str | None, what: str) -> str:
    key = param or "the source parameter"
    return f"To use a local copy, set {key} to {what}."


def download(url: str, dest: Path, *, sha256: str | None, expected_bytes: int | None = None,
             timeout: float = 60.0, corpus: str = "data", param: str | None = None,
             sha_param: str | None = None,
             local_hint: str = "a local path or file:// URL of the file") -> Path:
    """Fetch ``url`` (http(s), ``file://`` or a local path) into ``dest`` atomically.

    The bytes go to a temporary file next to ``dest`` while their sha256 is computed; only when
    the byte count matches the server's ``Content-Length`` (and ``expected_bytes``) and the
    digest matches ``sha256`` is the file renamed to ``dest``. Otherwise the temporary file is
    removed and :class:`IntegrityError` (corrupt) or :class:`SourceUnavailableError`
    (unreachable) is raised, naming the corpus, the URL and the parameter to change.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    where = f"{corpus}: {url}"
    h = hashlib.sha256()
    # atomic_open removes its temporary file if anything below raises
    with atomic_open(dest, "wb") as out:
        if _is_remote(url):
            log.info("downloading %s -> %s", url, dest)
            try:
                req = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
                resp = urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 (http/s)
            except (urllib.error.URLError, http.client.HTTPException, OSError,
                    ValueError) as err:
                raise SourceUnavailableError(
                    f"{where} is unreachable ({err}). {_hint(param, local_hint)}") from err
            with resp:
                length = resp.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name,
                          disable=None) as bar:
                    try:
                        n = copy_hashed(resp, out, h, bar)
                    except (OSError, http.client.HTTPException) as err:  # IncompleteRead, ...
                        raise IntegrityError(
                            f"{where}: download interrupted after {out.tell()} bytes "
                            f"({err!r}); nothing was kept, run again to retry") from err
            if total is not None and n != total:
                raise IntegrityError(f"{where}: truncated download, got {n} of {total} "
                                     "bytes; nothing was kept, run again to retry")
        else:
            src = _local_path(url)
            if not src.is_file():
                raise SourceUnavailableError(
                    f"{where}: no such file {src}. {_hint(param, local_hint)}")
            log.info("copying %s -> %s", src, dest)
            with open(src, "rb") as fh:
                n = copy_hashed(fh, out, h)
        if expected_bytes is not None and n != expected_bytes:
            raise IntegrityError(f"{where}: got {n} bytes, expected {expected_bytes}; "
                                 "nothing was kept")
        digest = h.hexdigest()
        if sha256 is not None and digest != sha256:
            raise IntegrityError(
                f"{where}: sha256 mismatch, got {digest}, pinned {sha256} ({n} bytes); "
                f"nothing was kept. If the source is a trusted mirror with a different "
                f"packing, change {sha_param or 'the pinned sha256'} accordingly.")
    log.info("verified %s (%d bytes, sha256 %s)", dest, n, h.hexdigest())
    return dest


# ----------------------------------------------------------------------------------------------
# enwik8


def fetch_enwik8(url: str = ENWIK8_URL, sha256: str | None = ENWIK8_ZIP_SHA256,
                 cache_dir: str | os.PathLike = "data/raw", timeout: float = 60.0, *,
                 raw_sha256: str | None = ENWIK8_RAW_SHA256,
                 raw_bytes: int | None = ENWIK8_RAW_BYTES, member: str = "enwik8",
                 param_prefix: str = "data.corpora.enwik8") -> Path:
    """Download, verify and unzip ``enwik8.zip``; return the path of the raw unzipped file.

    Cache layout under ``cache_dir/enwik8/``: ``enwik8.zip`` (kept, so a damaged raw file is
    re-extracted without the network), ``<member>`` (the raw bytes) and ``<member>.json``
    (provenance and checksums). A call first re-verifies the cached raw file (size and sha256;
    about 0.3 s for 100 MB) and returns it untouched when good; a damaged one is logged and
    rebuilt, from the cached zip when that still verifies, else by downloading again.

    ``url`` may be ``http(s)://``, ``file://`` or a plain local path to the zip. ``sha256`` pins
    the zip; ``raw_sha256``/``raw_bytes`` pin the unzipped member. At least one sha256 is needed.
    """
    sha256 = _sha256_hex(sha256, f"{param_prefix}.sha256")
    raw_sha256 = _sha256_hex(raw_sha256, f"{param_prefix}.raw_sha256")
    check(sha256 is not None or raw_sha256 is not None, f"{param_prefix}.sha256", None,
          f"at least one of {param_prefix}.sha256 (zip) and {param_prefix}.raw_sha256 "
          "(unzipped) must be pinned")
    check(raw_bytes is None or (isinstance(raw_bytes, int) and raw_bytes > 0),
          f"{param_prefix}.raw_bytes", raw_bytes, "must be a positive integer or null")
    check(isinstance(url, str) and bool(url), f"{param_prefix}.url", url,
          "must be an http(s):// or file:// URL or a local path of enwik8.zip")
    root = Path(cache_dir) / "enwik8"
    zip_path = root / "enwik8.zip"
    raw_path = root / member
    meta_path = root / f"{member}.json"

    if raw_path.exists():
        problem = _check_raw(raw_path, meta_path, sha256, raw_sha256, raw_bytes)
        if problem is None:
            log.info("enwik8: using cached %s (verified)", raw_path)
            return raw_path
        log.warning("enwik8: cached %s is not usable (%s); rebuilding it", raw_path, problem)
        _unlink_quietly(raw_path)
        _unlink_quietly(meta_path)

    if zip_path.exists():
        if sha256 is not None and sha256_file(zip_path) != sha256:
            log.warning("enwik8: cached %s does not match the pinned sha256; downloading again",
                        zip_path)
            _unlink_quietly(zip_path)
        elif sha256 is None:
            log.info("enwik8: cached %s has no zip pin; its payload is checked on extraction",
                     zip_path)
    if not zip_path.exists():
        download(url, zip_path, sha256=sha256, timeout=timeout, corpus="enwik8",
                 param=f"{param_prefix}.url", sha_param=f"{param_prefix}.sha256",
                 local_hint="a local path or file:// URL of enwik8.zip (or place a verified "
                            f"enwik8.zip at {zip_path})")
    zip_digest = sha256_file(zip_path)
    try:
        digest, n = _extract_member(zip_path, member, raw_path, raw_sha256, raw_bytes)
    except IntegrityError:
        _unlink_quietly(zip_path)  # a zip whose payload is bad must not be reused
        raise
    atomic_write_json(meta_path, {
        "corpus": "enwik8", "url": url, "zip_sha256": zip_digest, "member": member,
        "bytes": n, "sha256": digest,
    })
    log.info("enwik8: raw file ready at %s (%d bytes)", raw_path, n)
    return raw_path


def _check_raw(raw_path: Path, meta_path: Path, zip_sha256: str | None, raw_sha256: str | None,
               raw_bytes: int | None) -> str | None:
    """None if the cached raw file verifies against its sidecar and the pins, else why not."""
    if not meta_path.exists():
        return f"its sidecar {meta_path.name} is missing"
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError) as err:
        return f"its sidecar is unreadable ({err})"
    size = raw_path.stat().st_size
    if size != meta.get("bytes") or (raw_bytes is not None and size != raw_bytes):
        want = raw_bytes if raw_bytes is not None else meta.get("bytes")
        return f"size {size} != expected {want}"
    if zip_sha256 is not None and meta.get("zip_sha256") != zip_sha256:
        return "it was extracted from a different zip than the pinned one"
    digest = sha256_file(raw_path)
    if digest != meta.get("sha256") or (raw_sha256 is not None and digest != raw_sha256):
        return f"sha256 {digest} does not match"
    return None


def _extract_member(zip_path: Path, member: str, dest: Path, raw_sha256: str | None,
                    raw_bytes: int | None) -> tuple[str, int]:
    """Stream ``member`` out of ``zip_path`` into ``dest`` atomically, verifying it."""
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(zip_path) as zf:
            names = zf.namelist()
            if member not in names:
                raise IntegrityError(f"enwik8: {zip_path} has no member {member!r} "
                                     f"(members: {names[:5]})")
            log.info("unzipping %s:%s -> %s", zip_path, member, dest)
            with zf.open(member) as src, atomic_open(dest, "wb") as out:
                n = copy_hashed(src, out, h)
                digest = h.hexdigest()
                if raw_bytes is not None and n != raw_bytes:
                    raise IntegrityError(f"enwik8: unzipped {member} has {n} bytes, expected "
                                         f"{raw_bytes}")
                if raw_sha256 is not None and digest != raw_sha256:
                    raise IntegrityError(f"enwik8: unzipped {member} has sha256 {digest}, "
                                         f"pinned {raw_sha256}")
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:
        raise IntegrityError(f"enwik8: {zip_path} is not a valid zip ({err}); it was removed, "
                             "run again to download it afresh") from err
    return digest, n


# ----------------------------------------------------------------------------------------------
# Hugging Face datasets


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


def hf_cache_paths(source: str, *, split: str, text_field: str, byte_budget: int | None,
                   config_name: str | None, separator: str, cache_dir: str | os.PathLike,
                   revision: str | None = None) -> tuple[Path, Path]:
    """The cached text file and its sidecar for one (source, split, ...) request."""
    key = json.dumps([source, config_name, revision, split, text_field, byte_budget, separator,
                      local_fingerprint(source)])
    tag = hashlib.sha256(key.encode()).hexdigest()[:10]
    name = f"{_slug(split)}-{tag}"
    root = Path(cache_dir) / "hf" / _slug(source)
    return root / f"{name}.txt", root / f"{name}.json"


def fetch_hf_text(source: str, *, split: str, text_field: str = "text",
                  byte_budget: int | None = None, streaming: bool = False,
                  cache_dir: str | os.PathLike, config_name: str | None = None,
                  separator: str = DEFAULT_SEPARATOR, revision: str | None = None,
                  corpus: str | None = None, param_prefix: str | None = None) -> Path:
    """Write one split of a text dataset as a single UTF-8 byte stream; return its path.

    ``source`` is a hub id (``roneneldan/TinyStories``) or a local copy: a directory written by
    ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``, a directory of data files that
    ``datasets.load_dataset`` reads (json/jsonl/parquet/csv/txt; split names come from the file
    names, e.g. ``train.jsonl``/``validation.jsonl``), or one such data file (split ``train``).

    Rule: documents are taken in dataset order; empty (whitespace-only) documents are skipped;
    the others are encoded as UTF-8 and joined with ``separator`` (default a blank line,
    ``"\\n\\n"``), with no separator after the last. With ``byte_budget`` the stream stops before
    the first document that would push it past the budget (a document boundary), so it is at
    most ``byte_budget`` bytes and only the documents needed are read (use ``streaming=True``
    for large hub datasets).

    ``revision`` pins a hub dataset to a commit/tag (recommended for reproducibility).

    The result is cached under ``cache_dir/hf/<source>/`` with a JSON sidecar (source, split,
    n_docs, bytes, sha256, ...), keyed by every argument that changes the bytes (and, for a
    local copy, the names, sizes and mtimes of its files); a cached file is re-verified on every
    call and rebuilt when it does not match its sidecar.
    """
    corpus = corpus or source
    pfx = param_prefix or "source"
    check(isinstance(source, str) and bool(source), f"{pfx}.source" if param_prefix else "source",
          source, "must be a hub id or a local dataset path")
    check(byte_budget is None or (isinstance(byte_budget, int) and not isinstance(
        byte_budget, bool) and byte_budget > 0), f"{pfx}.byte_budget" if param_prefix else
        "byte_budget", byte_budget, "must be a positive integer (bytes) or null")
    out, meta_path = hf_cache_paths(source, split=split, text_field=text_field,
                                    byte_budget=byte_budget, config_name=config_name,
                                    separator=separator, cache_dir=cache_dir, revision=revision)
    if out.exists():
        problem = _check_text(out, meta_path)
        if problem is None:
            log.info("%s: using cached %s split %r at %s (verified)", corpus, source, split, out)
            return out
        log.warning("%s: cached %s is not usable (%s); fetching it again", corpus, out, problem)
        _unlink_quietly(out)
        _unlink_quietly(meta_path)

    docs, resolved = _open_text_docs(source, split=split, text_field=text_field,
                                     streaming=streaming, config_name=config_name,
                                     revision=revision, cache_dir=cache_dir, corpus=corpus,
                                     param_prefix=pfx)
    sep = separator.encode("utf-8")
    h = hashlib.sha256()
    n_bytes = n_docs = n_empty = 0
    stopped_by_budget = False
    log.info("%s: writing %s split %r (%s) -> %s", corpus, source, split,
             f"budget {byte_budget} bytes" if byte_budget else "all documents", out)
    with atomic_open(out, "wb") as fh, tqdm(total=byte_budget, unit="B", unit_scale=True,
                                            desc=f"{corpus}:{split}", disable=None) as bar:
        for text in docs:
            if not text.strip():
                n_empty += 1
                continue
            data = text.encode("utf-8", errors="surrogatepass")
            add = len(data) + (len(sep) if n_docs else 0)
            if byte_budget is not None and n_bytes + add > byte_budget:
                stopped_by_budget = True
                break
            if n_docs:
                fh.write(sep)
                h.update(sep)
            fh.write(data)
            h.update(data)
            n_bytes += add
            n_docs += 1
            bar.update(add)
        if n_docs == 0:
            raise ParameterError(
                f"{pfx}.byte_budget" if stopped_by_budget else f"{pfx}.source",
                byte_budget if stopped_by_budget else source,
                f"{corpus}: split {split!r} yielded no documents"
                + (" (the first document is larger than the budget)" if stopped_by_budget
                   else " with non-empty text"))
    atomic_write_json(meta_path, {
        "corpus": corpus, "source": source, "resolved": resolved, "config_name": config_name,
        "revision": revision,
        "split": split, "text_field": text_field, "byte_budget": byte_budget,
        "separator": separator, "n_docs": n_docs, "n_empty_skipped": n_empty,
        "truncated_by_budget": stopped_by_budget, "bytes": n_bytes, "sha256": h.hexdigest(),
    })
    log.info("%s: %d documents, %d bytes -> %s", corpus, n_docs, n_bytes, out)
    return out


def _check_text(path: Path, meta_path: Path) -> str | None:
    if not meta_path.exists():
        return f"its sidecar {meta_path.name} is missing"
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError) as err:
        return f"its sidecar is unreadable ({err})"
    size = path.stat().st_size
    if size != meta.get("bytes"):
        return f"size {size} != {meta.get('bytes')} recorded"
    digest = sha256_file(path)
    if digest != meta.get("sha256"):
        return f"sha256 {digest} != {meta.get('sha256')} recorded"
    return None


def _open_text_docs(source: str, *, split: str, text_field: str, streaming: bool,
                    config_name: str | None, revision: str | None,
                    cache_dir: str | os.PathLike, corpus: str,
                    param_prefix: str) -> tuple[Iterator[str], str]:
    """An iterator over the text column of one split, and a description of what was opened."""
    import datasets  # heavy import, only when needed

    path = Path(source).expanduser()
    hf_cache = str(Path(cache_dir) / "hf_datasets")
    if path.exists():
        ds, resolved = _open_local(path, split=split, streaming=streaming,
                                   config_name=config_name, hf_cache=hf_cache,
                                   param_prefix=param_prefix)
    else:
        if _looks_like_path(source):
            raise SourceUnavailableError(
                f"{corpus}: local dataset path {source} does not exist. "
                f"Set {param_prefix}.source to a hub id or to an existing local copy "
                "(a save_to_disk directory or a directory of json/parquet/txt files).")
        log.info("%s: loading hub dataset %s (config %s, revision %s, split %r, streaming=%s)",
                 corpus, source, config_name, revision, split, streaming)
        try:
            ds = datasets.load_dataset(source, config_name, split=split, streaming=streaming,
                                       cache_dir=hf_cache, revision=revision)
        except ValueError as err:
            if "split" in str(err).lower() and "unknown" in str(err).lower():
                raise ParameterError(f"{param_prefix}.split", split,
                                     f"{corpus}: not a split of {source} ({err})") from err
            raise _hub_unavailable(corpus, source, param_prefix, err) from err
        except Exception as err:  # noqa: BLE001 -- network, auth, not-found, offline mode
            raise _hub_unavailable(corpus, source, param_prefix, err) from err
        resolved = f"hub:{source}"
    columns = list(ds.column_names or []) if getattr(ds, "column_names", None) else None
    if columns is not None and text_field not in columns:
        raise ParameterError(f"{param_prefix}.text_field", text_field,
                             f"{corpus}: no such column in {source} split {split!r} "
                             f"(columns: {columns})")
    return _iter_text(ds, text_field, corpus, source, param_prefix), resolved


def _looks_like_path(source: str) -> bool:
    """A hub id is ``name`` or ``owner/name``; anything else that does not exist is a path."""
    return (source.startswith((".", "/", "~")) or source.count("/") > 1 or "\\" in source
            or Path(source).suffix.lower() in _DATA_FILE_BUILDERS)


def _hub_unavailable(corpus: str, source: str, param_prefix: str, err: BaseException
                     ) -> SourceUnavailableError:
    return SourceUnavailableError(
        f"{corpus}: cannot load {source!r} from the Hugging Face hub "
        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). "
        f"To use a local copy, set {param_prefix}.source to a directory written by "
        "Dataset(Dict).save_to_disk, a directory of json/jsonl/parquet/txt files "
        "(train.jsonl, validation.jsonl, ...), or one such file.")


def _open_local(path: Path, *, split: str, streaming: bool, config_name: str | None,
                hf_cache: str, param_prefix: str) -> tuple[Any, str]:
    import datasets

    if path.is_dir() and ((path / "dataset_dict.json").exists()
                          or (path / "state.json").exists()):
        log.info("loading saved dataset from %s", path)
        obj = datasets.load_from_disk(str(path))
        if isinstance(obj, datasets.DatasetDict):
            if split not in obj:
                raise ParameterError(f"{param_prefix}.split", split,
                                     f"not a split of {path} (splits: {sorted(obj)})")
            ds = obj[split]
        else:
            saved = str(obj.split) if obj.split is not None else None
            if (saved or "train") != split:
                raise ParameterError(f"{param_prefix}.split", split,
                                     f"{path} holds a single dataset of split "
                                     f"{saved or 'train'!r}")
            ds = obj
        if streaming:
            ds = ds.to_iterable_dataset()
        return ds, f"save_to_disk:{path}"
    if path.is_file():
        builder = _DATA_FILE_BUILDERS.get(path.suffix.lower())
        check(builder is not None, f"{param_prefix}.source", str(path),
              f"a local data file must end in one of {sorted(_DATA_FILE_BUILDERS)}")
        check(split == "train", f"{param_prefix}.split", split,
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
        raise ParameterError(f"{param_prefix}.split", split,
                             f"cannot read split {split!r} from {path}: {err}") from err
    except FileNotFoundError as err:
        raise ParameterError(f"{param_prefix}.source", str(path),
                             f"holds no data files that datasets can read ({err})") from err
    return ds, f"data_files:{path}"


def _iter_text(ds: Iterable[dict], text_field: str, corpus: str, source: str,
               param_prefix: str) -> Iterator[str]:
    for i, row in enumerate(ds):
        if text_field not in row:
            raise ParameterError(f"{param_prefix}.text_field", text_field,
                                 f"{corpus}: row {i} of {source} has no such field "
                                 f"(fields: {sorted(row)})")
        value = row[text_field]
        if value is None:
            continue
        if not isinstance(value, str):
            raise ParameterError(f"{param_prefix}.text_field", text_field,
                                 f"{corpus}: row {i} holds {type(value).__name__}, not text")
        yield value


__all__ = [
    "DEFAULT_SEPARATOR", "DataError", "ENWIK8_RAW_BYTES", "ENWIK8_RAW_SHA1", "ENWIK8_RAW_SHA256",
    "ENWIK8_URL", "ENWIK8_ZIP_BYTES", "ENWIK8_ZIP_SHA256", "IntegrityError",
    "KINDS", "SourceUnavailableError", "download", "fetch_corpus", "fetch_enwik8", "fetch_hf_text",
    "hf_cache_paths", "validate_corpus_spec",
]


# ----------------------------------------------------------------------------------------------
# corpus specs (``data.corpora.<name>`` in params.yaml)

KINDS = ("embedded", "enwik8", "hf")
_SPLIT_DEFAULT_FRACTIONS = [0.9, 0.05, 0.05]


def _spec_defaults(kind: str) -> dict[str, Any]:
    """Every allowed key of a corpus spec of ``kind`` with its default (``...`` = required)."""
    from lmrepro.data.embedded import SHAKESPEARE_TXT_SHA256

    if kind == "embedded":
        return {"kind": kind, "path": "data/embedded/shakespeare.txt",
                "sha256": SHAKESPEARE_TXT_SHA256, "split_fractions": None, "split_bytes": None}
    if kind == "enwik8":
        return {"kind": kind, "url": ENWIK8_URL, "sha256": ENWIK8_ZIP_SHA256,
                "raw_sha256": ENWIK8_RAW_SHA256, "raw_bytes": ENWIK8_RAW_BYTES,
                "member": "enwik8", "timeout": 60.0, "split_bytes": None,
                "split_fractions": None}
    return {"kind": kind, "source": ..., "config_name": None, "revision": None,
            "text_field": "text",
            "train_split": "train", "val_split": None, "test_split": None, "streaming": False,
            "byte_budget": None, "val_byte_budget": None, "separator": DEFAULT_SEPARATOR,
            "split_fractions": None, "split_bytes": None}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_corpus_spec(name: str, spec: Any, prefix: str = "data.corpora") -> dict[str, Any]:
    """Check one ``data.corpora.<name>`` mapping; return it completed with defaults.

    Raises :class:`ParameterError` naming the key path (``data.corpora.enwik8.url``), the bad
    value and what is allowed: unknown kind, unknown key, wrong type, negative budget, both
    ``split_bytes`` and ``split_fractions``, ...
    """
    from lmrepro.data.prepare import _check_fractions, _check_split_bytes

    base = f"{prefix}.{name}"
    check(isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", name or "") is not None,
          prefix, name, "corpus names are letters, digits, '_', '-', '.'")
    check(isinstance(spec, dict), base, spec, "must be a mapping with at least 'kind'")
    kind = spec.get("kind")
    check(kind in KINDS, f"{base}.kind", kind, f"must be one of {list(KINDS)}")
    out = _spec_defaults(kind)
    for key, value in spec.items():
        check(key in out, f"{base}.{key}", value,
              f"unknown key for a corpus of kind {kind!r} (allowed: {sorted(out)})")
        out[key] = value
    key = f"{base}."
    for k, v in out.items():
        if v is ...:
            raise ParameterError(key + k, None, f"is required for a corpus of kind {kind!r}")
    for k in ("sha256", "raw_sha256"):
        if k in out:
            out[k] = _sha256_hex(out[k], key + k)
    if out["split_bytes"] is not None and out["split_fractions"] is not None:
        raise ParameterError(key + "split_bytes", out["split_bytes"],
                             "give split_bytes or split_fractions, not both")
    if out["split_bytes"] is not None:
        _check_split_bytes(out["split_bytes"], key + "split_bytes")
        out["split_bytes"] = list(out["split_bytes"])
    if out["split_fractions"] is not None:
        _check_fractions(out["split_fractions"], key + "split_fractions")
        out["split_fractions"] = [float(f) for f in out["split_fractions"]]

    if kind == "embedded":
        check(isinstance(out["path"], str) and bool(out["path"]), key + "path", out["path"],
              "must be the path of a text file")
        if out["split_bytes"] is None and out["split_fractions"] is None:
            out["split_fractions"] = list(_SPLIT_DEFAULT_FRACTIONS)
    elif kind == "enwik8":
        check(isinstance(out["url"], str) and bool(out["url"]), key + "url", out["url"],
              "must be an http(s):// or file:// URL or a local path of enwik8.zip")
        check(out["sha256"] is not None or out["raw_sha256"] is not None, key + "sha256", None,
              "pin at least one of sha256 (zip) and raw_sha256 (unzipped)")
        check(out["raw_bytes"] is None or (_is_int(out["raw_bytes"]) and out["raw_bytes"] > 0),
              key + "raw_bytes", out["raw_bytes"], "must be a positive integer or null")
        check(isinstance(out["member"], str) and bool(out["member"]), key + "member",
              out["member"], "must be the name of the file inside the zip")
        check(isinstance(out["timeout"], (int, float)) and not isinstance(out["timeout"], bool)
              and out["timeout"] > 0, key + "timeout", out["timeout"],
              "must be a positive number of seconds")
        out["timeout"] = float(out["timeout"])
        if out["split_bytes"] is None and out["split_fractions"] is None:
            out["split_bytes"] = [90_000_000, 5_000_000, 5_000_000]
    else:
        check(isinstance(out["source"], str) and bool(out["source"]), key + "source",
              out["source"], "must be a hub id (owner/name) or a local dataset path")
        for k in ("config_name", "revision", "val_split", "test_split"):
            check(out[k] is None or (isinstance(out[k], str) and bool(out[k])), key + k, out[k],
                  "must be a non-empty string or null")
        for k in ("text_field", "train_split", "separator"):
            check(isinstance(out[k], str) and (bool(out[k]) or k == "separator"), key + k,
                  out[k], "must be a string" + ("" if k == "separator" else " (non-empty)"))
        check(isinstance(out["streaming"], bool), key + "streaming", out["streaming"],
              "must be true or false")
        for k in ("byte_budget", "val_byte_budget"):
            check(out[k] is None or (_is_int(out[k]) and out[k] > 0), key + k, out[k],
                  "must be a positive integer (bytes) or null")
        if out["val_split"] is None:
            check(out["test_split"] is None, key + "test_split", out["test_split"],
                  "needs val_split")
            check(out["val_byte_budget"] is None, key + "val_byte_budget",
                  out["val_byte_budget"], "needs val_split")
            if out["split_bytes"] is None and out["split_fractions"] is None:
                out["split_fractions"] = list(_SPLIT_DEFAULT_FRACTIONS)
        else:
            bad = "split_bytes" if out["split_bytes"] is not None else "split_fractions"
            check(out[bad] is None, key + bad, out[bad],
                  "must be unset when val_split is given (each split is its own file)")
    return out


def fetch_corpus(name: str, spec: dict[str, Any], cache_dir: str | os.PathLike, *,
                 prefix: str = "data.corpora") -> dict[str, Any]:
    """Fetch (or verify the cache of) one corpus; return what prepare needs.

    Cache layout: enwik8 under ``cache_dir/enwik8/``, Hugging Face text under
    ``cache_dir/<name>/hf/<source>/``; an embedded corpus is read where it is installed.

    Returns ``{"corpus", "kind", "spec" (completed with defaults), "files": [[split, path], ...],
    "sha256": {split: digest}}`` where ``split`` is ``"all"`` for a single stream that prepare
    cuts by bytes/fractions, or ``"train"``/``"val"``/``"test"`` for per-split files.
    """
    spec = validate_corpus_spec(name, spec, prefix)
    key = f"{prefix}.{name}"
    kind = spec["kind"]
    files: list[list[str]] = []
    digests: dict[str, str] = {}
    log.info("fetch: corpus %s (%s) into %s", name, kind, cache_dir)
    if kind == "embedded":
        path = Path(spec["path"])
        if not path.is_file():
            raise SourceUnavailableError(
                f"{name}: embedded corpus {path} is missing. Install it with "
                f"`lmrepro install-corpus --dest {path.parent}` (project set-up does this; it "
                f"reaches only the package index), or set {key}.path to a local text file "
                f"(and {key}.sha256 to its sha256, or null).")
        digest = sha256_file(path)
        if spec["sha256"] is not None and digest != spec["sha256"]:
            raise IntegrityError(
                f"{name}: {path} has sha256 {digest}, pinned {spec['sha256']} "
                f"({key}.sha256): damaged or a different file; reinstall with "
                f"`lmrepro install-corpus --dest {path.parent}`")
        files.append(["all", str(path)])
        digests["all"] = digest
    elif kind == "enwik8":
        path = fetch_enwik8(spec["url"], spec["sha256"], cache_dir, spec["timeout"],
                            raw_sha256=spec["raw_sha256"], raw_bytes=spec["raw_bytes"],
                            member=spec["member"], param_prefix=key)
        files.append(["all", str(path)])
        digests["all"] = read_json(path.with_name(f"{path.name}.json"))["sha256"]
    else:
        wanted: list[tuple[str, str, int | None]]
        if spec["val_split"] is None:
            wanted = [("all", spec["train_split"], spec["byte_budget"])]
        else:
            wanted = [("train", spec["train_split"], spec["byte_budget"]),
                      ("val", spec["val_split"], spec["val_byte_budget"])]
            if spec["test_split"] is not None:
                wanted.append(("test", spec["test_split"], spec["val_byte_budget"]))
        for role, hf_split, budget in wanted:
            path = fetch_hf_text(spec["source"], split=hf_split, text_field=spec["text_field"],
                                 byte_budget=budget, streaming=spec["streaming"],
                                 cache_dir=Path(cache_dir) / name,
                                 config_name=spec["config_name"],
                                 separator=spec["separator"], revision=spec["revision"],
                                 corpus=name, param_prefix=key)
            files.append([role, str(path)])
            digests[role] = read_json(path.with_suffix(".json"))["sha256"]
    return {"corpus": name, "kind": kind, "spec": spec, "files": files, "sha256": digests}
