"""How a command of lmrepro ends: logging set up, and our errors reported as one message with
their exit status, no traceback (docs/reliability.md). Bad input (a parameter, the parameter
file, a damaged checkpoint, a run directory another process is writing) exits with 2; a failure
of the machine or the data (a full disk, a corrupt download, a NaN about to be written) with 1.
Any OSError a command meets (no space left, permission denied, a read-only file system, a missing
input: exit 2) is one line naming the path, what happened and what to do
(:func:`lmrepro.io.os_error_message`). A notebook that failed on one of these errors is reported
the same way. ``-v`` prints the traceback above the line.

Shared by the ``lmrepro`` command (:mod:`lmrepro.cli`) and the commands that run without it
(``python -m lmrepro.scape.train.worker``, the SCAPE worker under torchrun).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
import traceback
from typing import NoReturn

from lmrepro.data import DataError
from lmrepro.errors import ParameterError

# errors whose message is the whole story: reported as one message, without a traceback
BAD_INPUT = frozenset({"ParameterError", "ConfigError", "ParamsFileError", "CheckpointError",
                       "RunDirectoryBusy"})
#: the OSError classes a notebook's cell may raise: one line too (:func:`_kernel_os_error`)
OS_ERRORS = frozenset({"OSError", "PermissionError", "FileNotFoundError", "IsADirectoryError",
                       "NotADirectoryError", "FileExistsError", "InterruptedError"})
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
    evalue = str(getattr(err, "evalue", "")).strip()
    if ename in OS_ERRORS:
        return _kernel_os_error(ename, evalue)
    if ename not in BAD_INPUT | FAILURE:
        return None
    return NotebookError(f"{ename}: {evalue}", 2 if ename in BAD_INPUT else 1)


#: an OSError as the kernel reports it: ``[Errno 13] Permission denied: 'a'`` (``-> 'b'``)
_KERNEL_OS_ERROR = re.compile(r"^\[Errno (\d+)\] ([^:]*)(?:: '(.*?)')?(?: -> '(.*?)')?$")


def _kernel_os_error(ename: str, evalue: str) -> NotebookError:
    """The one line of an OSError raised in a notebook's kernel (its class and text are all
    that cross the kernel's boundary), worded as the command line words it."""
    from lmrepro.io import os_error_message

    match = _KERNEL_OS_ERROR.match(evalue)
    if match is None:
        return NotebookError(f"{ename}: {evalue}", 1)
    number, strerror, path, other = match.groups()
    text = os_error_message(OSError(int(number), strerror, path, None, other))
    return NotebookError(f"{ename}: {text}", 2 if ename == "FileNotFoundError" else 1)


def execute(args: argparse.Namespace) -> int:
    """Run the parsed command ``args.func``: logging set up, our errors as one line with their
    exit status (the module docstring). Also the entry of a command run without the rest of the
    CLI (``python -m lmrepro.scape.train.worker``, the SCAPE worker)."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from lmrepro.io import DamagedFileError, NonFiniteError, os_error_in, os_error_message

    try:
        return int(args.func(args) or 0)
    except ParameterError as err:
        return _one_line(args, f"lmrepro: error: {err}", 2)
    except NotebookError as err:
        return _one_line(args, f"lmrepro: error: {args.notebook} failed: {err}", err.status)
    except DataError as err:
        return _one_line(args, f"lmrepro: data error: {err}", 1)
    except (NonFiniteError, DamagedFileError) as err:
        return _one_line(args, f"lmrepro: error: {err}", 1)
    except Exception as err:
        # any OSError (a full disk, permission denied, a read-only file system, a missing
        # input), also wrapped by torch: one line; anything else keeps its traceback
        cause = os_error_in(err)
        if cause is None:
            raise
        # a missing input is bad input (2); the machine failing to write is a failure (1)
        status = 2 if isinstance(cause, FileNotFoundError) else 1
        return _one_line(args, f"lmrepro: error: {os_error_message(cause)}", status)


def _one_line(args: argparse.Namespace, line: str, status: int) -> int:
    """Print ``line`` (the traceback first under ``-v``) and return ``status``."""
    if getattr(args, "verbose", False):
        traceback.print_exc()
    _close_progress_bars()
    print(line, file=sys.stderr)
    return status


def _close_progress_bars() -> None:
    """Close the progress bars the error interrupted: each ends its line now, so the error
    starts a line of its own (left open, a bar is closed at exit, after the error, which was
    printed on the bar's line: ``... loss=5.214]lmrepro: error: ...``)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or []):
        with contextlib.suppress(Exception):
            bar.close()
