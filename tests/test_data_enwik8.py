"""enwik8 fetcher against a real HTTP server on 127.0.0.1 serving a small zip of the same shape."""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lmrepro.data import (DataConfig, Enwik8Spec, IntegrityError, SourceUnavailableError,
                          fetch_corpus, fetch_enwik8)
from lmrepro.errors import ParameterError

RAW = bytes((i * 7 + i // 13) % 251 for i in range(20_000)) + b"<page>enwik8-like</page>\n" * 40
RAW_SHA = hashlib.sha256(RAW).hexdigest()
PIN = {"raw_sha256": RAW_SHA, "raw_bytes": len(RAW)}


def make_zip(member: str = "enwik8", data: bytes = RAW) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
    return buf.getvalue()


ZIP = make_zip()
ZIP_SHA = hashlib.sha256(ZIP).hexdigest()


def spec(url: str, sha256: str | None = ZIP_SHA, timeout: float = 10) -> Enwik8Spec:
    """An enwik8 spec for ``url`` whose payload pins are those of the small test zip."""
    return Enwik8Spec(url=url, sha256=sha256, timeout=timeout, **PIN)


class Server:
    """A tiny HTTP server: ``files`` maps paths to bytes; ``lie`` paths send half the bytes
    under a full Content-Length; every GET is counted."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.lie: set[str] = set()
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.hits.append(self.path)
                body = outer.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if self.path in outer.lie else body)
                self.wfile.flush()
                if self.path in outer.lie:
                    self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server():
    s = Server()
    yield s
    s.close()


def leftovers(root: Path) -> list[str]:
    """Files under root, temporary ones included (names like .enwik8.zip.XXXX.tmp)."""
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_download_verify_unzip_and_resume_from_cache(server, tmp_path):
    server.files["/enwik8.zip"] = ZIP
    raw = fetch_enwik8(spec(server.url("/enwik8.zip")), tmp_path)
    assert raw == tmp_path / "enwik8" / "enwik8"
    assert raw.read_bytes() == RAW
    assert (tmp_path / "enwik8" / "enwik8.zip").read_bytes() == ZIP
    assert server.hits == ["/enwik8.zip"]
    assert leftovers(tmp_path) == ["enwik8", "enwik8.json", "enwik8.zip"]
    # second call: served from the verified cache, the server is not contacted
    again = fetch_enwik8(spec(server.url("/enwik8.zip")), tmp_path)
    assert again == raw and len(server.hits) == 1


def test_bad_checksum_is_an_error_and_leaves_nothing(server, tmp_path):
    server.files["/enwik8.zip"] = ZIP
    with pytest.raises(IntegrityError, match="sha256 mismatch") as err:
        fetch_enwik8(spec(server.url("/enwik8.zip"), "0" * 64), tmp_path)
    assert "data.corpora.enwik8.sha256" in str(err.value)
    assert leftovers(tmp_path) == []


def test_truncated_transfer_is_an_error_and_leaves_nothing(server, tmp_path):
    server.files["/enwik8.zip"] = ZIP
    server.lie.add("/enwik8.zip")
    with pytest.raises(IntegrityError, match=r"(?i)truncated|interrupted"):
        fetch_enwik8(spec(server.url("/enwik8.zip")), tmp_path)
    assert leftovers(tmp_path) == []


def test_truncated_zip_without_zip_pin_is_caught_by_unzip(server, tmp_path):
    # served completely (honest Content-Length) but the archive itself is cut short
    server.files["/enwik8.zip"] = ZIP[: len(ZIP) - 200]
    with pytest.raises(IntegrityError, match="not a valid zip"):
        fetch_enwik8(spec(server.url("/enwik8.zip"), None), tmp_path)
    assert leftovers(tmp_path) == []  # the bad zip is not kept for the next run


def test_wrong_payload_is_an_error(server, tmp_path):
    other = make_zip(data=RAW[:-1] + b"X")
    server.files["/enwik8.zip"] = other
    with pytest.raises(IntegrityError, match="unzipped enwik8 has sha256"):
        fetch_enwik8(spec(server.url("/enwik8.zip"), hashlib.sha256(other).hexdigest()), tmp_path)
    assert leftovers(tmp_path) == []


def test_zip_without_enwik8_member_is_an_error(server, tmp_path):
    server.files["/enwik8.zip"] = make_zip(member="other")
    with pytest.raises(IntegrityError, match="no member 'enwik8'"):
        fetch_enwik8(spec(server.url("/enwik8.zip"), None), tmp_path)


def test_damaged_cached_raw_is_rebuilt_from_the_cached_zip(server, tmp_path):
    server.files["/enwik8.zip"] = ZIP
    raw = fetch_enwik8(spec(server.url("/enwik8.zip")), tmp_path)
    data = bytearray(raw.read_bytes())
    data[100] ^= 0xFF  # same size, one flipped byte
    raw.write_bytes(bytes(data))
    again = fetch_enwik8(spec(server.url("/enwik8.zip")), tmp_path)
    assert again.read_bytes() == RAW
    assert len(server.hits) == 1  # rebuilt from the verified cached zip, no new download


def test_damaged_cached_zip_is_downloaded_again(server, tmp_path):
    server.files["/enwik8.zip"] = ZIP
    raw = fetch_enwik8(spec(server.url("/enwik8.zip")), tmp_path)
    raw.unlink()
    (tmp_path / "enwik8" / "enwik8.zip").write_bytes(ZIP[:100])
    assert fetch_enwik8(spec(server.url("/enwik8.zip")), tmp_path).read_bytes() == RAW
    assert len(server.hits) == 2


def test_unreachable_source_names_corpus_url_and_params_key(tmp_path):
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/enwik8.zip"
    with pytest.raises(SourceUnavailableError) as err:
        fetch_enwik8(spec(url, timeout=5), tmp_path)
    msg = str(err.value)
    assert "enwik8" in msg and url in msg and "data.corpora.enwik8.url" in msg
    assert "local" in msg


def test_http_404_is_unreachable(server, tmp_path):
    with pytest.raises(SourceUnavailableError, match="404"):
        fetch_enwik8(Enwik8Spec(url=server.url("/missing.zip"), sha256=ZIP_SHA, timeout=5),
                     tmp_path)


def test_local_copy_by_path_and_file_url(tmp_path):
    local = tmp_path / "mirror" / "enwik8.zip"
    local.parent.mkdir()
    local.write_bytes(ZIP)
    raw = fetch_enwik8(spec(str(local)), tmp_path / "a")
    assert raw.read_bytes() == RAW
    raw = fetch_enwik8(spec(local.as_uri()), tmp_path / "b")
    assert raw.read_bytes() == RAW
    with pytest.raises(SourceUnavailableError, match="no such file"):
        fetch_enwik8(spec(str(tmp_path / "nope.zip")), tmp_path / "c")


def test_parameter_checks():
    with pytest.raises(ParameterError, match="data.corpora.enwik8.sha256"):
        DataConfig(use=["enwik8"], corpora={"enwik8": {"kind": "enwik8", "url": "x",
                                                       "sha256": "abc"}})
    with pytest.raises(ParameterError, match="at least one"):
        Enwik8Spec(url="x", sha256=None, raw_sha256=None)


def test_fetch_corpus_enwik8_spec(server, tmp_path):
    server.files["/e.zip"] = ZIP
    keys = {"kind": "enwik8", "url": server.url("/e.zip"), "sha256": ZIP_SHA,
            "raw_sha256": RAW_SHA, "raw_bytes": len(RAW), "split_bytes": [1000, 100, 100]}
    got = fetch_corpus("enwik8", Enwik8Spec(**keys), tmp_path)
    assert got["files"] == [["all", str(tmp_path / "enwik8" / "enwik8")]]
    assert got["sha256"] == {"all": RAW_SHA}
    assert got["spec"]["split_bytes"] == [1000, 100, 100]
