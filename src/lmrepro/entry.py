"""How a command of lmrepro ends: logging set up, and our errors reported as one message with
their exit status, no traceback (docs/reliability.md). Bad input (a parameter, the parameter
file, a damaged checkpoint, a run directory another process is writing) exits with 2; a failure
of the machine or the data (a full disk, a corrupt download, a NaN about to be written) with 1.
A notebook that failed on one of these errors is reported the same way.

Shared by the ``lmrepro`` command (:mod:`lmrepro.cli`) and the commands that run without it
(``python -m lmrepro.scape.train.worker``, the SCAPE worker under torchrun).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from lmrepro.data import DataError
from lmrepro.errors import ParameterError

# errors whose message is the whole story: reported as one message, without a traceback
BAD_INPUT = frozenset({"ParameterError", "ConfigError", "ParamsFileError", "CheckpointError",
                       "RunDirectoryBusy"})
FAILURE = frozenset({"DiskFullError", "NonFiniteError", "DamagedFileError", "DataError",
                     "IntegrityError", "SourceUnavailableError"})


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with one-line usage errors, exit status 2 like any bad input, e.g.
    ``lmrepro predict: error: argument --world-size: expected one argument (lmrepro predict
    --help for more)``. The sub-command parsers of one (``add_subparsers``) are of this class
    too, so the ``lmrepro`` command builds every parser of its wings through it."""

    def error(self, message: str) -> NoReturn:
        # argparse prints its usage block first: 20-40 lines for a trainer's generated flags,
        # burying the one line that says what is wrong; --help still shows it all
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} ({self.prog} --help for more)\n")


class NotebookError(RuntimeError):
    """A notebook stopped on one of our own errors: ``status`` is that error's exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def notebook_error(err: BaseException) -> NotebookError | None:
    """The :class:`NotebookError` for papermill's report of a cell that raised one of our own
    errors (by class name: the error was raised in the kernel), else None."""
    ename = getattr(err, "ename", None)
    if ename not in BAD_INPUT | FAILURE:
        return None
    evalue = str(getattr(err, "evalue", "")).strip()
    return NotebookError(f"{ename}: {evalue}", 2 if ename in BAD_INPUT else 1)


def execute(args: argparse.Namespace) -> int:
    """Run the parsed command ``args.func``: logging set up, our errors as one line with their
    exit status (the module docstring). Also the entry of a command run without the rest of the
    CLI (``python -m lmrepro.scape.train.worker``, the SCAPE worker)."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from lmrepro.io import DamagedFileError, DiskFullError, NonFiniteError

    try:
        return int(args.func(args) or 0)
    except ParameterError as err:
        print(f"lmrepro: error: {err}", file=sys.stderr)
        return 2
    except NotebookError as err:
        print(f"lmrepro: error: {args.notebook} failed: {err}", file=sys.stderr)
        return err.status
    except DiskFullError as err:    # before FileNotFoundError: both are OSError
        print(f"lmrepro: error: {err}", file=sys.stderr)
        return 1
    except FileNotFoundError as err:
        print(f"lmrepro: error: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"lmrepro: data error: {err}", file=sys.stderr)
        return 1
    except (NonFiniteError, DamagedFileError) as err:
        print(f"lmrepro: error: {err}", file=sys.stderr)
        return 1
