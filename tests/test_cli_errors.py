"""Command-line mistakes are one line naming what the user typed (docs/reliability.md).

A usage error is argparse's one line and a hint, not its 20-40-line usage block first.
"""

from __future__ import annotations

import pytest


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
    from lmrepro.scape.cli import worker_main

    prog = "python -m lmrepro.scape.cli"
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
