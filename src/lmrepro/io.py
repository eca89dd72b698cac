"""Atomic file writes and small JSON/JSONL helpers.

Every product of the pipeline is written to a temporary file in the same directory, flushed,
fsync'ed and then renamed over the target, so a killed run leaves either the old file or the new
one, never half of one. The rules every writer here follows (docs/reliability.md):

* **permissions**: a product gets the mode of any file the process creates (``0o666`` less the
  umask: ``0644`` under the usual umask), not ``mkstemp``'s private ``0600``;
* **finite numbers only**: JSON is written with ``allow_nan=False``; a NaN or infinity is refused
  with :class:`NonFiniteError` naming the file and the key path, and read back as an error too
  (``NaN`` is not JSON, and a summary holding one is not a finished run);
* **a full disk** (``ENOSPC``/``EDQUOT``, even when torch buries it in a chained exception) raises
  :class:`DiskFullError`: "no space left on device" with the path; the partial temporary file is
  removed and the previous product stays;
* **damaged files** raise :class:`DamagedFileError` naming the file, the line and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import math
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from lmrepro.lifetime import fault_point, owner_gone, owner_tag

FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: the errors of a place that cannot be written (os_errors_as names the product instead)
WRITE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class DiskFullError(OSError):
    """No space (or quota) left while writing ``path``; the previous file, if any, is intact."""

    def __init__(self, path: str | os.PathLike, cause: OSError | None = None) -> None:
        self.path = str(path)
        free = _free_bytes(Path(path).parent)
        where = f"; {free} bytes free there" if free is not None else ""
        super().__init__(cause.errno if cause is not None else errno.ENOSPC,
                         f"no space left on device writing {self.path}{where}: free space "
                         "(or move the output elsewhere) and run again; nothing already "
                         "written was lost, and an interrupted run resumes from its last "
                         "checkpoint")

    def __str__(self) -> str:
        return str(self.args[1])

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:   # picklable across processes
        return (DiskFullError, (self.path, OSError(self.errno, os.strerror(self.errno or 28))))


class NonFiniteError(ValueError):
    """A NaN or infinity was about to be written to (or was read from) a JSON file."""


class DamagedFileError(ValueError):
    """A file is not what its writer writes (truncated, edited, or from elsewhere)."""


def _free_bytes(directory: Path) -> int | None:
    for d in (directory, *directory.parents):
        if d.exists():
            with contextlib.suppress(OSError):
                return shutil.disk_usage(d).free
            return None
    return None


def full_disk_cause(exc: BaseException) -> OSError | None:
    """The ``ENOSPC``/``EDQUOT`` error in ``exc`` or its chain (torch wraps it), or None."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL_DISK_ERRNOS:
            return e
        stack += [e.__cause__, e.__context__]
    return None


#: what to do about an OSError, by errno (the path is named before it)
_OS_ERROR_ADVICE = {
    errno.EACCES: ("permission denied", "make it writable for this user (chmod u+w, or chown) "
                   "or write the output elsewhere, then run again"),
    errno.EPERM: ("operation not permitted", "make it writable for this user (chmod u+w, or "
                  "chown) or write the output elsewhere, then run again"),
    errno.EROFS: ("read-only file system", "remount it read-write or write the output "
                  "elsewhere, then run again"),
    errno.ENOENT: ("no such file or directory", "create it, or run the stage that writes it "
                   "first (dvc repro), then run again"),
    errno.ENOTDIR: ("not a directory", "a file stands where a folder is expected: move it "
                    "aside, then run again"),
    errno.EISDIR: ("is a directory", "a folder stands where a file is expected: move it aside, "
                   "then run again"),
}


def os_error_message(err: OSError) -> str:
    """One line for an OSError a command met: the path, what happened and what to do.

    Every product is written atomically (:func:`atomic_open`), so a failed write keeps the
    previous file: the line says so. A full disk reads as :class:`DiskFullError` does."""
    if isinstance(err, DiskFullError):
        return str(err)
    path, other = err.filename, err.filename2
    if err.errno in FULL_DISK_ERRNOS:
        return str(DiskFullError(other if other is not None else path or "?", err))
    what, todo = _OS_ERROR_ADVICE.get(err.errno or 0, (
        (err.strerror or str(err)).lower(), "check the path and the device, then run again"))
    where = f"{path}" if path is not None else "(no path given)"
    if other is not None:
        where += f" (to {other})"
    return f"{what}: {where}: {todo}; nothing already written was lost"


def os_error_in(exc: BaseException) -> OSError | None:
    """``exc`` itself when it is an OSError, else a full disk in its chain (torch wraps the
    writer's OSError in a RuntimeError), else None."""
    return exc if isinstance(exc, OSError) else full_disk_cause(exc)


@contextlib.contextmanager
def full_disk_as(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise a full-disk failure anywhere below as :class:`DiskFullError` naming ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except BaseException as exc:
        cause = full_disk_cause(exc)
        if cause is None:
            raise
        raise DiskFullError(path, cause) from exc


TMP_SUFFIX = ".tmp"     # every temporary name ends so: .gitignore and .dvcignore hold *.tmp


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary siblings of ``path`` (``.<name>.<pid>-<host>-<hex>.tmp``) whose
    writer was killed: the next write of a product clears what a killed one left."""
    prefix = f".{path.name}."
    stale = [p for p in path.parent.glob(f"{glob.escape(prefix)}*{TMP_SUFFIX}")
             if owner_gone(p.name[len(prefix):-len(TMP_SUFFIX)])]
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return stale


@contextlib.contextmanager
def os_errors_as(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an OSError below (a full disk, a read-only file system, permission denied) as
    one naming ``path``: the product being written, not the temporary that held it."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if err.errno in FULL_DISK_ERRNOS:
            raise DiskFullError(path, err) from err
        if err.errno not in WRITE_ERRNOS:
            raise               # a missing input names itself
        raise OSError(err.errno, err.strerror, str(path)) from err


def _create_private_sibling(path: Path) -> tuple[int, Path]:
    """A new temporary file next to ``path``, created with mode ``0o666`` so that the kernel
    applies the process's umask (``mkstemp`` would make it ``0600``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    remove_stale_temporaries(path)
    while True:
        tmp = path.with_name(f".{path.name}.{owner_tag()}-{secrets.token_hex(4)}{TMP_SUFFIX}")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; rename it over ``path`` on success.

    The file gets the process's umask permissions; a full disk raises :class:`DiskFullError`;
    on any failure the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    with full_disk_as(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_private_sibling(path)
        try:
            with os.fdopen(fd, mode) as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            fault_point(f"replace:{path.name}")   # test hook: killed with the new file unnamed
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


RENAME_EXCHANGE = 2     # renameat2's flag: swap two paths in one step (Linux 3.15)
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` in one step (Linux ``renameat2``); False where the system
    or the file system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rename2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if rename2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def replace_dir(new: str | os.PathLike, dest: str | os.PathLike) -> Path | None:
    """Put the complete folder ``new`` at ``dest``; returns where the previous ``dest`` went
    (``new``'s path: remove it), None when there was none.

    Where the system can, the two are swapped in one step, so ``dest`` always names a
    complete folder, the old or the new, whenever the process is killed. Elsewhere ``dest`` is
    renamed to ``new``'s name plus ``.previous`` first: a kill between the two renames leaves
    it there, and :func:`restore_previous_dir` puts it back."""
    new, dest = Path(new), Path(dest)
    if not dest.exists():
        os.rename(new, dest)
        return None
    if _exchange(new, dest):
        return new
    previous = new.with_name(new.name + ".previous")
    os.rename(dest, previous)
    os.rename(new, dest)
    return previous


def restore_previous_dir(dest: str | os.PathLike, candidates: list[Path]) -> Path | None:
    """When ``dest`` is missing and a ``<name>.previous`` folder of :func:`replace_dir` lies in
    one of the ``candidates`` (scratch folders of killed runs), put it back at ``dest``."""
    dest = Path(dest)
    if dest.exists():
        return None
    for folder in candidates:
        previous = folder / f"{dest.name}.previous"
        if previous.is_dir():
            os.rename(previous, dest)
            return dest
    return None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def non_finite_paths(obj: Any, prefix: str = "") -> list[str]:
    """Key paths (``a.b[2]``) of every NaN or infinity in a JSON-like object."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [prefix or "<top>"]
    if isinstance(obj, dict):
        return [p for k, v in obj.items()
                for p in non_finite_paths(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in non_finite_paths(v, f"{prefix}[{i}]")]
    return []


def dumps(obj: Any, path: str | os.PathLike, indent: int | None = None) -> str:
    """``json.dumps`` that refuses NaN and infinity, naming ``path`` and the key path."""
    try:
        return json.dumps(obj, indent=indent, sort_keys=True, allow_nan=False)
    except ValueError as err:
        bad = non_finite_paths(obj)
        if not bad:
            raise
        raise NonFiniteError(f"refusing to write a non-finite number (NaN or infinity) to "
                             f"{path} at {', '.join(bad[:5])}: NaN is not JSON and not a "
                             "result; the value was computed from a run that diverged or did "
                             "not train") from err


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, dumps(obj, path, indent=2) + "\n")


def _refuse_constant(path: str | os.PathLike) -> Any:
    def refuse(name: str) -> Any:
        raise NonFiniteError(f"{path} holds {name}, which is not JSON: it was written by a "
                             "run that produced no finite result; move the run directory "
                             "aside (mv DIR DIR.bad) and run again")
    return refuse


def loads(text: str, path: str | os.PathLike) -> Any:
    """``json.loads`` that refuses NaN/Infinity and names ``path``, line and column."""
    try:
        return json.loads(text, parse_constant=_refuse_constant(path))
    except json.JSONDecodeError as err:
        raise DamagedFileError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}); "
                               "the file is damaged or was not written by lmrepro") from None


def read_json(path: str | os.PathLike) -> Any:
    return loads(Path(path).read_text(encoding="utf-8"), path)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through a temporary file; load with ``torch.load(weights_only=True)``."""
    import torch   # here, not at the top: the command line reads JSON without loading torch

    with atomic_open(path, "wb") as fh:
        torch.save(obj, fh)


def torch_load(path: str | os.PathLike) -> Any:
    """Load a checkpoint without executing code from it (``weights_only=True``)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line and flush it (metrics logs are append-only); NaN is refused."""
    path = Path(path)
    line = dumps(record, path) + "\n"
    with full_disk_as(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()


def jsonl_text(records: list[dict], path: str | os.PathLike) -> str:
    """The JSONL text of ``records`` as :func:`append_jsonl` writes them."""
    return "".join(dumps(r, path) + "\n" for r in records)


def read_jsonl(path: str | os.PathLike, drop_partial_tail: bool = False) -> list[dict]:
    """The records of a JSONL file ([] if it does not exist).

    ``drop_partial_tail``: ignore a last line without its newline (an append cut short by a kill
    or a full disk); resuming runs use it, since such a line always belongs to a step after the
    last checkpoint. Any other damaged line raises :class:`DamagedFileError` naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if drop_partial_tail and lines and lines[-1].strip():
        lines = lines[:-1]
    out = []
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line, parse_constant=_refuse_constant(f"{path}:{lineno}")))
        except json.JSONDecodeError as err:
            raise DamagedFileError(f"{path}:{lineno}:{err.colno}: not a JSON record "
                                   f"({err.msg}); the file is damaged") from None
    return out


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()
