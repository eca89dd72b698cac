"""Prepared splits, manifest verification, load_split, the data stages and the corpus specs."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from lmrepro.data import (CorpusSpec, DataConfig, EmbeddedSpec, IntegrityError,
                          SourceUnavailableError, data_identity, fetch_all, is_prepared, load_split,
                          load_splits, prepare_all, prepare_corpus, prepare_from_spec,
                          read_manifest)
from lmrepro.data.prepare import split_sizes_from_fractions
from lmrepro.errors import ParameterError

RAW = bytes(np.random.default_rng(0).integers(0, 256, 10_007, dtype=np.uint8))


def corpus(name: str, spec: object) -> CorpusSpec:
    """``spec`` validated as ``data.corpora.<name>`` of params.yaml."""
    return DataConfig(use=[name], corpora={name: spec}).corpora[name]


@pytest.fixture()
def raw_file(tmp_path):
    p = tmp_path / "raw.txt"
    p.write_bytes(RAW)
    return p


def test_split_bytes_layout_and_manifest(raw_file, tmp_path):
    out = tmp_path / "prep"
    m = prepare_corpus(raw_file, out, split_bytes=(9000, 500, 500), source={"corpus": "x"})
    assert (out / "train.bin").read_bytes() == RAW[:9000]
    assert (out / "val.bin").read_bytes() == RAW[9000:9500]
    assert (out / "test.bin").read_bytes() == RAW[9500:10000]  # the last 7 bytes are unused
    disk = read_manifest(out)
    assert disk == json.loads(json.dumps(m))
    assert disk["source"] == {"corpus": "x"}
    assert disk["split_rule"] == {"kind": "bytes", "split_bytes": [9000, 500, 500]}
    assert disk["files"]["val"]["sha256"] == hashlib.sha256(RAW[9000:9500]).hexdigest()
    assert disk["files"]["test"]["bytes"] == 500
    assert disk["created_by"].startswith("lmrepro ")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test.bin", "train.bin",
                                                       "val.bin"]


def test_split_fractions(raw_file, tmp_path):
    assert split_sizes_from_fractions(10_007, (0.9, 0.05, 0.05)) == (9006, 500, 501)
    prepare_corpus(raw_file, tmp_path / "p", split_fractions=(0.9, 0.05, 0.05), source={})
    parts = [(tmp_path / "p" / f"{s}.bin").read_bytes() for s in ("train", "val", "test")]
    assert b"".join(parts) == RAW and [len(p) for p in parts] == [9006, 500, 501]


def test_load_split_is_verified_read_only_memmap(raw_file, tmp_path):
    prepare_corpus(raw_file, tmp_path / "p", split_bytes=(9000, 500, 500), source={})
    arr = load_split(tmp_path / "p", "val")
    assert isinstance(arr, np.memmap) and arr.dtype == np.uint8 and not arr.flags.writeable
    assert bytes(arr) == RAW[9000:9500]


def test_damaged_prepared_file_is_reported_naming_it(raw_file, tmp_path):
    out = tmp_path / "p"
    prepare_corpus(raw_file, out, split_bytes=(9000, 500, 500), source={})
    data = bytearray((out / "train.bin").read_bytes())
    data[5] ^= 1
    (out / "train.bin").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"train\.bin has sha256"):
        load_split(out, "train")
    assert load_split(out, "train", verify=False)[5] == data[5]  # explicit opt-out only
    (out / "val.bin").write_bytes(RAW[:10])
    with pytest.raises(IntegrityError, match=r"val\.bin has 10 bytes"):
        load_split(out, "val")
    (out / "test.bin").unlink()
    with pytest.raises(IntegrityError, match=r"test\.bin is missing"):
        load_split(out, "test")
    assert not is_prepared(out)
    (out / "manifest.json").unlink()
    with pytest.raises(IntegrityError, match=r"manifest\.json is missing"):
        load_split(out, "val")


def test_bad_split_name_and_bad_rules(raw_file, tmp_path):
    prepare_corpus(raw_file, tmp_path / "p", split_bytes=(9000, 500, 500), source={})
    with pytest.raises(ParameterError, match=r"split = 'valid'.*\['train', 'val', 'test'\]"):
        load_split(tmp_path / "p", "valid")
    with pytest.raises(ParameterError, match="needs 10008 bytes"):
        prepare_corpus(raw_file, tmp_path / "q", split_bytes=(9008, 500, 500))
    with pytest.raises(ParameterError, match="summing to 1"):
        prepare_corpus(raw_file, tmp_path / "q", split_fractions=(0.9, 0.1, 0.1))
    with pytest.raises(ParameterError, match="not both"):
        prepare_corpus(raw_file, tmp_path / "q", split_bytes=(1, 1, 1),
                       split_fractions=(0.9, 0.05, 0.05))
    with pytest.raises(ParameterError, match="must be an existing file"):
        prepare_corpus(tmp_path / "missing.txt", tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_per_split_files_with_and_without_test(tmp_path):
    tr, va, te = tmp_path / "tr", tmp_path / "va", tmp_path / "te"
    tr.write_bytes(b"train bytes " * 10)
    va.write_bytes(b"0123456789a")
    te.write_bytes(b"TEST")
    m = prepare_corpus([("train", tr), ("val", va)], tmp_path / "p", source={})
    assert load_split(tmp_path / "p", "val").tobytes() == b"01234"
    assert load_split(tmp_path / "p", "test").tobytes() == b"56789a"
    assert m["split_rule"]["kind"] == "files"
    prepare_corpus([("train", tr), ("val", va), ("test", te)], tmp_path / "p2", source={})
    assert load_split(tmp_path / "p2", "test").tobytes() == b"TEST"
    with pytest.raises(ParameterError, match="'val'"):
        prepare_corpus([("train", tr)], tmp_path / "p3")
    with pytest.raises(ParameterError, match="raw\\[1\\].split = 'dev'"):
        prepare_corpus([("train", tr), ("dev", va)], tmp_path / "p3")


def test_prepare_from_spec_embedded_skips_when_up_to_date(raw_file, tmp_path):
    sha = hashlib.sha256(RAW).hexdigest()
    spec = EmbeddedSpec(path=str(raw_file), sha256=sha)
    out = prepare_from_spec("shk", spec, tmp_path / "raw", tmp_path / "prep")
    assert out == tmp_path / "prep" / "shk"
    m = read_manifest(out)
    assert m["source"]["raw_sha256"] == {"all": sha}
    assert m["split_rule"]["split_fractions"] == [0.9, 0.05, 0.05]
    mtime = (out / "manifest.json").stat().st_mtime_ns
    prepare_from_spec("shk", spec, tmp_path / "raw", tmp_path / "prep")
    assert (out / "manifest.json").stat().st_mtime_ns == mtime  # up to date: untouched
    # a changed spec prepares again
    prepare_from_spec("shk", spec.replace(split_fractions=[0.8, 0.1, 0.1]), tmp_path / "raw",
                      tmp_path / "prep")
    assert len(load_split(out, "val")) == 1000
    # a damaged split is detected and prepared again, never silently used
    (out / "val.bin").write_bytes(b"x" * 1000)
    prepare_from_spec("shk", spec.replace(split_fractions=[0.8, 0.1, 0.1]), tmp_path / "raw",
                      tmp_path / "prep")
    assert load_split(out, "val").tobytes() == RAW[8005:9005]


def test_embedded_spec_missing_or_wrong_file(raw_file, tmp_path):
    with pytest.raises(SourceUnavailableError, match="install-corpus"):
        prepare_from_spec("shk", EmbeddedSpec(path=str(tmp_path / "none.txt")),
                          tmp_path / "raw", tmp_path / "prep")
    with pytest.raises(IntegrityError, match=r"data\.corpora\.shk\.sha256"):
        prepare_from_spec("shk", EmbeddedSpec(path=str(raw_file)),
                          tmp_path / "raw", tmp_path / "prep")  # default pin: Shakespeare


@pytest.mark.parametrize("spec, key, text", [
    ({"kind": "zip"}, "data.corpora.c.kind", "must be one of"),
    ({"kind": "enwik8", "urll": "x"}, "data.corpora.c.urll", "unknown key"),
    ({"kind": "hf"}, "data.corpora.c.source", "required"),
    ({"kind": "hf", "source": "a/b", "byte_budget": -5}, "data.corpora.c.byte_budget",
     "positive integer"),
    ({"kind": "hf", "source": "a/b", "byte_budget": 1.5}, "data.corpora.c.byte_budget",
     "positive integer"),
    ({"kind": "hf", "source": "a/b", "streaming": "yes"}, "data.corpora.c.streaming", "true"),
    ({"kind": "hf", "source": "a/b", "val_split": "validation",
      "split_fractions": [0.9, 0.05, 0.05]}, "data.corpora.c.split_fractions", "val_split"),
    ({"kind": "enwik8", "sha256": "abc"}, "data.corpora.c.sha256", "64-character"),
    ({"kind": "enwik8", "split_bytes": [1, 2]}, "data.corpora.c.split_bytes", "three"),
    ({"kind": "embedded", "split_fractions": [0.5, 0.6, -0.1]},
     "data.corpora.c.split_fractions", "summing to 1"),
    ({"kind": "enwik8", "timeout": 0}, "data.corpora.c.timeout", "positive"),
    ("enwik8", "data.corpora.c", "mapping"),
])
def test_spec_errors_name_the_key_path(spec, key, text):
    with pytest.raises(ParameterError) as err:
        corpus("c", spec)
    assert err.value.name == key
    assert text in str(err.value) and str(err.value).startswith(key)


def test_spec_defaults():
    s = corpus("enwik8", {"kind": "enwik8"})
    assert s.url == "http://mattmahoney.net/dc/enwik8.zip"
    assert s.split_bytes == [90_000_000, 5_000_000, 5_000_000]
    assert s.sha256 == "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
    s = corpus("owt", {"kind": "hf", "source": "Skylion007/openwebtext", "streaming": True,
                       "byte_budget": 500_000_000, "split_fractions": [0.98, 0.01, 0.01]})
    assert s.split_fractions == [0.98, 0.01, 0.01] and s.text_field == "text"
    s = corpus("shakespeare", {"kind": "embedded", "path": "data/embedded/shakespeare.txt"})
    assert s.split_fractions == [0.9, 0.05, 0.05]


def test_data_stages(raw_file, tmp_path):
    data = DataConfig(raw_dir=str(tmp_path / "raw"), prepared_dir=str(tmp_path / "prep"),
                      use=["shk"], corpora={"shk": {"kind": "embedded", "path": str(raw_file),
                                                    "sha256": None}})
    fetched = fetch_all(data)
    assert fetched["shk"]["files"] == [["all", str(raw_file)]]
    assert json.loads((tmp_path / "raw" / "fetched.json").read_text()) == fetched
    assert prepare_all(data) == {"shk": tmp_path / "prep" / "shk"}
    train, val = load_splits(data, "shk")
    assert bytes(train) + bytes(val) == RAW[:9006 + 500]
    assert data_identity(tmp_path / "prep", "shk") == read_manifest(tmp_path / "prep" / "shk")
