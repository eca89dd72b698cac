"""Command-line mistakes are one line naming what the user typed (docs/reliability.md).

A usage error is argparse's one line and a hint, not its 20-40-line usage block first; a bad flag
value names the flag, its value and what is allowed, not the key path the value has in
params.yaml (which a value read from params.yaml keeps).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmrepro.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _usage_error(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


@pytest.mark.parametrize("argv,prog,needle", [
    (["predict", "--world-size"], "lmrepro predict", "argument --world-size: expected one "
     "argument"),
    (["predict", "--world-size", "two"], "lmrepro predict", "invalid int value: 'two'"),
    (["predict", "--density", "0.01"], "lmrepro predict", "--density was removed: use "
     "--sparsity"),
    (["train-scape", "--bogus"], "lmrepro train-scape", "required: --corpus-dir, --out"),
    (["train-scape", "--corpus-dir", "c", "--out", "o", "--bogus"], "lmrepro",
     "unrecognized arguments: --bogus"),
    (["train-rgc", "--executor", "x", "--out", "o"], "lmrepro train-rgc",
     "argument --executor: invalid choice: 'x'"),
    (["no-such-command"], "lmrepro", "invalid choice: 'no-such-command'"),
    ([], "lmrepro", "required: command"),
])
def test_a_usage_error_is_one_line_with_a_hint(argv, prog, needle, capsys):
    from lmrepro.cli import main

    lines = _usage_error(main, argv, capsys)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{prog}: error: ") and needle in lines[0]
    assert lines[0].endswith(f"({prog} --help for more)")


def test_the_scape_worker_entry_has_the_same_one_line_errors(capsys):
    from lmrepro.scape.train.worker import worker_main

    prog = "python -m lmrepro.scape.train.worker"
    lines = _usage_error(worker_main, ["--corpus-dir", "c", "--out", "o", "--steps"], capsys)
    assert lines == [f"{prog}: error: argument --steps: expected one argument ({prog} --help "
                     "for more)"]


def test_help_still_shows_every_flag(capsys):
    from lmrepro.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train-scape", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--sparsity" in out and "--model-n-layers" in out


def _scape_args(*flags: str):
    from lmrepro.cli import build_parser

    return build_parser().parse_args(["train-scape", "--corpus-dir", "c", "--out", "o", *flags])


@pytest.mark.parametrize("flags,cls,message", [
    (["--optimizer", "scape", "--sparsity", "1.2"], "ScapeRun",
     "--sparsity = 1.2: must be less than 1"),
    (["--optimizer", "adamw", "--sparsity", "0.5"], "ScapeRun",       # a cross-field rule
     "--sparsity = 0.5: must be 0 for the dense optimizer 'adamw'"),
    (["--sparsity", "0.5"], "ScapeRun", "--optimizer: is required"),
    (["--lr", "-1"], "ScapeConfig", "--lr = -1.0: must be greater than 0"),
    (["--model-n-layers", "0"], "ModelConfig",
     "--model-n-layers = 0: must be greater than or equal to 1"),
])
def test_a_bad_flag_value_names_the_flag(flags, cls, message):
    from lmrepro.config import from_arguments
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun

    section, kw = {"ScapeRun": (ScapeRun, {"exclude": ("lr",)}),
                   "ScapeConfig": (ScapeConfig, {}),
                   "ModelConfig": (ModelConfig, {"prefix": "model_"})}[cls]
    with pytest.raises(ConfigError) as err:
        from_arguments(section, _scape_args(*flags), **kw)
    assert str(err.value) == message
    assert err.value.name == message.split(" = ")[0].split(":")[0]


def test_a_nested_flag_and_a_json_base_are_named_as_given():
    """A field of a nested section is its ``--<section>-<field>`` flag; a value given in
    ``--config-json`` (not as a flag) keeps the key path it has in params.yaml."""
    from lmrepro.cli import build_parser
    from lmrepro.rgc.cli import config_from_args

    parse = build_parser().parse_args
    with pytest.raises(ConfigError, match=r"^--horizon = 9: must be an integer in \[1, "):
        config_from_args(parse(["train-rgc", "--out", "o", "--horizon", "9"]))
    with pytest.raises(ConfigError, match=r"^--model-tie-embeddings = True: must be false"):
        config_from_args(parse(["train-rgc", "--out", "o", "--model-tie-embeddings"]))
    with pytest.raises(ConfigError, match=r"^rgc\.horizon = 9: must be an integer"):
        config_from_args(parse(["train-rgc", "--out", "o", "--config-json", '{"horizon": 9}']))


def test_the_command_line_names_the_flag_and_params_yaml_the_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lmrepro", "train-scape", "--optimizer",
                           "scape", "--sparsity", "1.2", "--corpus-dir", str(tmp_path),
                           "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["lmrepro: error: --sparsity = 1.2: must be less than 1"]
    assert not (tmp_path / "run").exists()

    from lmrepro.pipeline.params import load_params

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["scape"]["runs"][2]["sparsity"] = 1.2      # scape90
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"\): scape\.runs\.2\.sparsity = 1\.2: must be less "):
        load_params(tmp_path / "params.yaml")
