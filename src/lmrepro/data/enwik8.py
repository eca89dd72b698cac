"""enwik8: download ``enwik8.zip``, verify it, unzip the member ``enwik8``, verify that.

The pins (zip sha256, payload size and sha256) are the defaults of
:class:`lmrepro.data.spec.Enwik8Spec`; a mirror that re-packs the zip sets ``sha256: null`` and
still gets the payload checked. Cache layout under ``cache_dir/enwik8/``: ``enwik8.zip`` (kept,
so a damaged raw file is re-extracted without the network), ``<member>`` (the raw bytes) and
``<member>.json`` (provenance and checksums).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lmrepro.data.download import cache_problem, download, unzip_member
from lmrepro.data.errors import IntegrityError
from lmrepro.data.spec import Enwik8Spec
from lmrepro.io import atomic_write_json, sha256_file

__all__ = ["fetch_enwik8"]

log = logging.getLogger(__name__)


def fetch_enwik8(spec: Enwik8Spec, cache_dir: str | os.PathLike = "data/raw", *,
                 param_prefix: str = "data.corpora.enwik8") -> Path:
    """Download, verify and unzip ``enwik8.zip``; return the path of the raw unzipped file.

    A call first re-verifies the cached raw file (size and sha256 against its sidecar and the
    pins; about 0.3 s for 100 MB) and returns it untouched when good; a damaged one is logged and
    rebuilt, from the cached zip when that still verifies, else by downloading again.
    ``spec.url`` may be ``http(s)://``, ``file://`` or a plain local path to the zip; messages
    name the keys under ``param_prefix``.
    """
    root = Path(cache_dir) / "enwik8"
    zip_path = root / "enwik8.zip"
    raw_path = root / spec.member
    meta_path = root / f"{spec.member}.json"

    if raw_path.exists():
        problem = cache_problem(raw_path, meta_path, {"bytes": spec.raw_bytes,
                                                      "sha256": spec.raw_sha256,
                                                      "zip_sha256": spec.sha256})
        if problem is None:
            log.info("enwik8: using cached %s (verified)", raw_path)
            return raw_path
        log.warning("enwik8: cached %s is not usable (%s); rebuilding it", raw_path, problem)
        raw_path.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)

    if zip_path.exists():
        if spec.sha256 is not None and sha256_file(zip_path) != spec.sha256:
            log.warning("enwik8: cached %s does not match the pinned sha256; downloading again",
                        zip_path)
            zip_path.unlink(missing_ok=True)
        elif spec.sha256 is None:
            log.info("enwik8: cached %s has no zip pin; its payload is checked on extraction",
                     zip_path)
    if not zip_path.exists():
        download(spec.url, zip_path, sha256=spec.sha256, timeout=spec.timeout, corpus="enwik8",
                 param=f"{param_prefix}.url", sha_param=f"{param_prefix}.sha256",
                 local_hint="a local path or file:// URL of enwik8.zip (or place a verified "
                            f"enwik8.zip at {zip_path})")
    zip_digest = sha256_file(zip_path)
    try:
        digest, n = unzip_member(zip_path, spec.member, raw_path, sha256=spec.raw_sha256,
                                 size=spec.raw_bytes, corpus="enwik8")
    except IntegrityError:
        zip_path.unlink(missing_ok=True)  # a zip whose payload is bad must not be reused
        raise
    atomic_write_json(meta_path, {
        "corpus": "enwik8", "url": spec.url, "zip_sha256": zip_digest, "member": spec.member,
        "bytes": n, "sha256": digest,
    })
    log.info("enwik8: raw file ready at %s (%d bytes)", raw_path, n)
    return raw_path
