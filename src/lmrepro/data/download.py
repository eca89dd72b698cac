"""Checksummed, cached, atomic file transfers: download or copy, unzip, re-verify a cache.

Every file is written to a temporary sibling and renamed into place only once verified
(:mod:`lmrepro.io`), so a failed or interrupted transfer never leaves a half-written file that a
later run could mistake for a good one. A cached file carries a JSON sidecar recording its size
and sha256; :func:`cache_problem` re-checks both (and any pins) before the cache is trusted.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from tqdm.auto import tqdm

from lmrepro.data.errors import IntegrityError, SourceUnavailableError
from lmrepro.io import atomic_open, read_json, sha256_file

__all__ = ["cache_problem", "copy_hashed", "download", "unzip_member"]

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_USER_AGENT = "lmrepro-data-fetch/1 (+urllib)"


def copy_hashed(src: BinaryIO, out: BinaryIO, h: hashlib._Hash, progress: Any = None) -> int:
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


def unzip_member(zip_path: Path, member: str, dest: Path, *, sha256: str | None,
                 size: int | None, corpus: str) -> tuple[str, int]:
    """Stream ``member`` out of ``zip_path`` into ``dest`` atomically, verifying its size and
    sha256 when pinned; return ``(sha256, bytes)``. A broken zip is an :class:`IntegrityError`."""
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(zip_path) as zf:
            names = zf.namelist()
            if member not in names:
                raise IntegrityError(f"{corpus}: {zip_path} has no member {member!r} "
                                     f"(members: {names[:5]})")
            log.info("unzipping %s:%s -> %s", zip_path, member, dest)
            with zf.open(member) as src, atomic_open(dest, "wb") as out:
                n = copy_hashed(src, out, h)
                digest = h.hexdigest()
                if size is not None and n != size:
                    raise IntegrityError(f"{corpus}: unzipped {member} has {n} bytes, "
                                         f"expected {size}")
                if sha256 is not None and digest != sha256:
                    raise IntegrityError(f"{corpus}: unzipped {member} has sha256 {digest}, "
                                         f"pinned {sha256}")
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:
        raise IntegrityError(f"{corpus}: {zip_path} is not a valid zip ({err}); it was removed, "
                             "run again to download it afresh") from err
    return digest, n


def cache_problem(path: Path, sidecar: Path, pins: dict[str, Any]) -> str | None:
    """None when the cached ``path`` can be trusted, otherwise what is wrong with it.

    ``sidecar`` is the JSON written next to ``path`` when it was made; it records the file's
    ``bytes`` and ``sha256``, which are checked against the file itself. Every pin that is not
    None (e.g. ``{"sha256": digest, "zip_sha256": digest}``) must equal the sidecar's record.
    """
    if not sidecar.exists():
        return f"its sidecar {sidecar.name} is missing"
    try:
        meta = read_json(sidecar)
    except (OSError, ValueError) as err:
        return f"its sidecar is unreadable ({err})"
    for key, pinned in pins.items():
        if pinned is not None and meta.get(key) != pinned:
            return f"{key} {meta.get(key)!r} recorded, {pinned!r} pinned"
    size = path.stat().st_size
    if size != meta.get("bytes"):
        return f"size {size} != {meta.get('bytes')} recorded"
    digest = sha256_file(path)
    if digest != meta.get("sha256"):
        return f"sha256 {digest} != {meta.get('sha256')} recorded"
    return None
