"""One writer per run directory: a trainer holds :func:`writer_lock` on its run directory and a
stage on its stage directory for as long as it runs (``fcntl.flock``: the kernel releases it when
the holder dies, however it dies, so a stale lock of a dead process is simply taken over); a
second writer stops at once with :class:`RunDirectoryBusy`, naming the directory and the PID that
holds it (docs/reliability.md)."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import functools
import inspect
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from lmrepro.errors import ParameterError
from lmrepro.lifetime import pid_alive

log = logging.getLogger(__name__)

WRITER_LOCK = ".writer.lock"



class RunDirectoryBusy(ParameterError):
    """Another live process holds the writer lock of the directory."""

    def __init__(self, directory: str | Path, holder: str) -> None:
        self.directory = str(directory)
        self.holder = holder
        super().__init__("run directory", self.directory,
                         f"is being written by {holder}; one writer per run directory: wait "
                         "for that run to end (or stop it), then run again")


_held: dict[str, list[int]] = {}    # realpath of a locked directory -> [fd, depth] (this process)
_held_guard = threading.Lock()


def _holder_record() -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "since": datetime.datetime.now(datetime.UTC).strftime(
                           "%Y-%m-%d %H:%M:%S UTC"),
                       "command": " ".join(sys.argv)[:300]}) + "\n"


def _read_holder(fd: int) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
        if isinstance(record, dict):
            return record
    return {}


def _pid_from_proc_locks(fd: int) -> int | None:
    """The PID /proc/locks gives for the flock on ``fd``'s file (Linux), or None."""
    inode = os.fstat(fd).st_ino
    with contextlib.suppress(OSError, ValueError, IndexError), \
            open("/proc/locks", encoding="ascii") as fh:
        for line in fh:
            parts = line.split()
            if "FLOCK" in parts and int(parts[5].rsplit(":", 1)[1]) == inode:
                return int(parts[4])
    return None


def _describe_holder(fd: int) -> str:
    """``PID n (command, since time)`` of the process holding the lock on ``fd``'s file."""
    record: dict[str, Any] = {}
    for _ in range(25):            # the holder writes its record right after taking the lock
        record = _read_holder(fd)
        if isinstance(record.get("pid"), int) and pid_alive(record["pid"]):
            break
        time.sleep(0.02)
    pid = record.get("pid") if isinstance(record.get("pid"), int) else None
    if pid is None or not pid_alive(pid):
        pid, record = _pid_from_proc_locks(fd), {}
    if pid is None:
        return "another process (its PID is unknown)"
    detail = ", ".join(f"{record[k]}" if k == "command" else f"{k} {record[k]}"
                       for k in ("command", "host", "since") if record.get(k))
    return f"PID {pid}" + (f" ({detail})" if detail else "")


@contextlib.contextmanager
def writer_lock(directory: str | Path, enabled: bool = True) -> Iterator[Path]:
    """Hold the writer lock of ``directory`` (created if needed) for the ``with`` block.

    Raises :class:`RunDirectoryBusy` at once when another live process holds it. The lock is an
    ``fcntl.flock`` on ``directory/.writer.lock``: the kernel drops it when its holder ends, so a
    lock left by a killed process is taken over (and logged); re-entrant within a process.
    ``enabled=False`` holds nothing (a distributed run's ranks other than 0)."""
    directory = Path(directory)
    if not enabled:
        yield directory
        return
    directory.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(directory)
    with _held_guard:
        if key in _held:
            _held[key][1] += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield directory
        finally:
            with _held_guard:
                _held[key][1] -= 1
        return
    fd = os.open(directory / WRITER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe_holder(fd)
        os.close(fd)
        raise RunDirectoryBusy(directory, holder) from None
    previous = _read_holder(fd)
    if previous.get("pid") not in (None, os.getpid()):
        log.warning("%s: took over the writer lock of PID %s, which ended without releasing "
                    "it (killed)", directory, previous.get("pid"))
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder_record().encode(), 0)
    with _held_guard:
        _held[key] = [fd, 1]
    try:
        yield directory
    finally:
        with _held_guard:
            _held[key][1] -= 1
            release = _held[key][1] == 0
            if release:
                del _held[key]
        if release:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)   # an ended run leaves an empty lock file (stable hashes)
            os.close(fd)


F = TypeVar("F", bound=Callable[..., Any])


def holds_writer_lock(argument: str) -> Callable[[F], F]:
    """Decorator: hold :func:`writer_lock` on the directory passed as ``argument`` for the whole
    call (nothing when it is None). One line on a trainer or a stage function."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            directory = bound.arguments[argument]
            if directory is None:
                return fn(*args, **kwargs)
            with writer_lock(directory):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def check_no_other_writer(root: str | Path) -> None:
    """Raise :class:`RunDirectoryBusy` if a live process other than this one holds the writer
    lock of ``root`` or of any directory below it (before ``root`` is moved aside)."""
    root = Path(root)
    for lock_file in sorted(root.rglob(WRITER_LOCK)):
        directory = lock_file.parent
        with _held_guard:
            if os.path.realpath(directory) in _held:
                continue
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirectoryBusy(directory, _describe_holder(fd)) from None
        finally:
            os.close(fd)
