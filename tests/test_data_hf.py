"""fetch_hf_text against local dataset directories (no hub: offline mode, tmp HF_HOME)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="lmrepro-hf-home-"))
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

from lmrepro.data import HfSpec, SourceUnavailableError, fetch_corpus  # noqa: E402
from lmrepro.data import hf as hf_mod  # noqa: E402
from lmrepro.data.hf import fetch_hf_text  # noqa: E402
from lmrepro.errors import ParameterError  # noqa: E402

datasets = pytest.importorskip("datasets")

TRAIN = ["Once upon a time there was a cat.", "", "The cat sat.\nIt was happy — très.",
         "   ", "A third story about a dog."]
VAL = ["Val one.", "Val two is longer."]
SEP = "\n\n"


def hf(source, **keys) -> HfSpec:
    """The spec of an ``hf`` corpus read from ``source`` (a path or a hub id)."""
    return HfSpec(source=str(source), **keys)


def joined(docs: list[str]) -> bytes:
    return SEP.join(d for d in docs if d.strip()).encode("utf-8")


@pytest.fixture(scope="module")
def saved_dict(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "tiny"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": TRAIN, "id": list(range(len(TRAIN)))}),
        "validation": datasets.Dataset.from_dict({"text": VAL, "id": [0, 1]}),
    }).save_to_disk(str(path))
    return path


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("files")
    for split, docs in (("train", TRAIN), ("validation", VAL)):
        with open(path / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for d in docs:
                fh.write(json.dumps({"text": d, "meta": 1}) + "\n")
    return path


def test_save_to_disk_dict_split_and_sidecar(saved_dict, tmp_path):
    out = fetch_hf_text(hf(saved_dict), split="train", cache_dir=tmp_path)
    assert out.read_bytes() == joined(TRAIN)
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["source"] == str(saved_dict) and meta["split"] == "train"
    assert meta["n_docs"] == 3 and meta["n_empty_skipped"] == 2
    assert meta["bytes"] == len(joined(TRAIN))
    assert meta["sha256"] == hashlib.sha256(joined(TRAIN)).hexdigest()
    val = fetch_hf_text(hf(saved_dict), split="validation", cache_dir=tmp_path)
    assert val.read_bytes() == joined(VAL) and val != out
    assert not [p for p in tmp_path.rglob("*.tmp")]


@pytest.mark.parametrize("streaming", [False, True])
def test_data_files_directory(files_dir, tmp_path, streaming):
    out = fetch_hf_text(hf(files_dir, streaming=streaming), split="validation", cache_dir=tmp_path)
    assert out.read_bytes() == joined(VAL)


def test_byte_budget_truncates_on_document_boundary(saved_dict, tmp_path):
    docs = [d for d in TRAIN if d.strip()]
    two = len((docs[0] + SEP + docs[1]).encode())
    out = fetch_hf_text(hf(saved_dict), split="train", byte_budget=two + 5, cache_dir=tmp_path)
    assert out.read_bytes() == (docs[0] + SEP + docs[1]).encode()
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["n_docs"] == 2 and meta["truncated_by_budget"] and meta["byte_budget"] == two + 5
    exact = fetch_hf_text(hf(saved_dict), split="train", byte_budget=two, cache_dir=tmp_path)
    assert exact.read_bytes() == (docs[0] + SEP + docs[1]).encode()
    with pytest.raises(ParameterError, match="larger than the budget"):
        fetch_hf_text(hf(saved_dict), split="train", byte_budget=3, cache_dir=tmp_path)
    with pytest.raises(ParameterError, match="byte_budget"):
        fetch_hf_text(hf(saved_dict), split="train", byte_budget=-1, cache_dir=tmp_path)


def test_cache_is_reused_and_damage_is_refetched(saved_dict, tmp_path, monkeypatch):
    out = fetch_hf_text(hf(saved_dict), split="train", cache_dir=tmp_path)
    calls = []
    real = hf_mod._open_text_docs
    monkeypatch.setattr(hf_mod, "_open_text_docs",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    assert fetch_hf_text(hf(saved_dict), split="train", cache_dir=tmp_path) == out
    assert calls == []  # verified cache, the dataset was not opened
    data = bytearray(out.read_bytes())
    data[0] ^= 0x20
    out.write_bytes(bytes(data))
    again = fetch_hf_text(hf(saved_dict), split="train", cache_dir=tmp_path)
    assert calls == [1] and again.read_bytes() == joined(TRAIN)


def test_single_saved_dataset_and_single_file(tmp_path):
    single = tmp_path / "single"
    datasets.Dataset.from_dict({"text": VAL}).save_to_disk(str(single))
    assert fetch_hf_text(hf(single), split="train", cache_dir=tmp_path / "c").read_bytes() \
        == joined(VAL)
    with pytest.raises(ParameterError, match="single dataset"):
        fetch_hf_text(hf(single), split="validation", cache_dir=tmp_path / "c")
    f = tmp_path / "docs.txt"
    f.write_text("line one\nline two\n", encoding="utf-8")
    assert fetch_hf_text(hf(f), split="train", cache_dir=tmp_path / "c").read_bytes() \
        == b"line one\n\nline two"


def test_bad_split_and_bad_field(saved_dict, files_dir, tmp_path):
    with pytest.raises(ParameterError, match=r"split.*'test'.*train.*validation"):
        fetch_hf_text(hf(saved_dict), split="test", cache_dir=tmp_path)
    with pytest.raises(ParameterError, match="test"):
        fetch_hf_text(hf(files_dir), split="test", cache_dir=tmp_path)
    with pytest.raises(ParameterError, match=r"text_field.*'story'.*columns"):
        fetch_hf_text(hf(saved_dict, text_field="story"), split="train", cache_dir=tmp_path)
    assert not list(tmp_path.rglob("*.txt"))


def test_unreachable_hub_id_names_corpus_hub_id_and_key(tmp_path):
    with pytest.raises(SourceUnavailableError) as err:
        fetch_hf_text(hf("roneneldan/TinyStories"), split="train", cache_dir=tmp_path,
                      corpus="tinystories", param_prefix="data.corpora.tinystories")
    msg = str(err.value)
    assert "tinystories" in msg and "roneneldan/TinyStories" in msg
    assert "data.corpora.tinystories.source" in msg and "save_to_disk" in msg
    with pytest.raises(SourceUnavailableError, match="does not exist"):
        fetch_hf_text(hf(tmp_path / "no" / "such" / "dir"), split="train", cache_dir=tmp_path)


def test_fetch_corpus_hf_with_train_and_val(saved_dict, tmp_path):
    spec = hf(saved_dict, train_split="train", val_split="validation", byte_budget=1000)
    got = fetch_corpus("tinystories", spec, tmp_path)
    roles = [r for r, _ in got["files"]]
    assert roles == ["train", "val"]
    paths = dict(got["files"])
    assert Path(paths["val"]).read_bytes() == joined(VAL)
    assert got["sha256"]["train"] == hashlib.sha256(joined(TRAIN)).hexdigest()
    assert str(tmp_path / "tinystories") in paths["train"]


def test_changed_local_copy_invalidates_the_cache(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text(json.dumps({"text": "first version"}) + "\n")
    a = fetch_hf_text(hf(src), split="train", cache_dir=tmp_path / "c")
    assert a.read_bytes() == b"first version"
    (src / "train.jsonl").write_text(json.dumps({"text": "second, longer version"}) + "\n")
    b = fetch_hf_text(hf(src), split="train", cache_dir=tmp_path / "c")
    assert b.read_bytes() == b"second, longer version"
