"""The fault matrix's harness (tests/test_faults.py): a command of ``lmrepro`` run in a project
folder of its own (a git repository with the project's ``.gitignore`` and ``.dvcignore``) through
each fault, with the real fault: SIGKILL at a fault point (``lifetime.fault_point``), a full
disk and a read-only file system (a tmpfs mounted on the command's output: root only), a damaged
input file. Each fault's outcome is checked the same way (:func:`check_cell`) and described in
one line for docs/reliability.md's table; a check that does not hold raises AssertionError.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmrepro.lifetime import FAULT_ENV

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
FAULTS = ("SIGKILL", "disk full", "read-only output", "damaged input")
#: what a command's error line starts with (lmrepro.entry)
ERROR_LINE = re.compile(r"^lmrepro: (data )?error: ")


def env(**extra: str) -> dict[str, str]:
    src = str(ROOT / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            **extra}


@dataclass
class Command:
    """One command of the matrix. ``argv``: its arguments after ``python -m lmrepro``;
    ``output``: the folder it writes (relative to the project; the tmpfs goes there);
    ``kill_points``: fault points spread over its run, hit in this order by one run that resumes
    after each; ``damage``: an input file it reads (relative); ``same``: the products of two
    finished projects that must be equal (the deterministic part), as comparable values;
    ``kept``: glob patterns under ``output`` of products that a failed run must leave byte for
    byte; ``setup``: fills a new project with the command's inputs."""

    name: str
    argv: list[str]
    output: str
    kill_points: tuple[str, ...]
    damage: str
    same: Callable[[Path], object]
    setup: Callable[[Path], None]
    kept: tuple[str, ...] = ()
    #: kill from outside (SIGKILL of the command's process) when each of these holds in the
    #: project, instead of the fault points (a notebook's cells run in its kernel, where a
    #: fault point would kill the kernel, not the command): ``(what, predicate)``
    kill_when: tuple[tuple[str, Callable[[Path], bool]], ...] = ()
    timeout_s: float = 900.0
    outcomes: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    returncode: int
    stderr: str


def run(cmd: Command, proj: Path, fault_at: str | None = None) -> Result:
    """``python -m lmrepro <argv>`` in ``proj``, a fault point armed when given; output to a
    file (a pipe would wait for orphans holding it)."""
    log = proj.parent / f"{proj.name}.{cmd.name}.log"
    extra = {FAULT_ENV: fault_at} if fault_at else {}
    with open(log, "w") as out:
        done = subprocess.run([PY, "-m", "lmrepro", *cmd.argv], cwd=proj, env=env(**extra),
                              stdout=subprocess.DEVNULL, stderr=out, timeout=cmd.timeout_s)
    return Result(done.returncode, log.read_text())


def finished(cmd: Command, proj: Path) -> Result:
    result = run(cmd, proj)
    assert result.returncode == 0, f"{cmd.name} in {proj}: {result.stderr[-3000:]}"
    return result


def new_project(path: Path, cmd: Command) -> Path:
    """A git repository holding the project's ignore files and the command's inputs, all
    committed (so ``git status`` shows what the command adds)."""
    path.mkdir(parents=True)
    for name in (".gitignore", ".dvcignore"):
        shutil.copyfile(ROOT / name, path / name)
    cmd.setup(path)
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "inputs")
    return path


def copy_project(template: Path, path: Path) -> Path:
    """A copy of the project ``template`` (its inputs made once: the same bytes in each)."""
    shutil.copytree(template, path, symlinks=True)
    return path


def git(proj: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=proj, check=True, capture_output=True,
                          text=True).stdout


def files(proj: Path) -> dict[str, str]:
    """Every file below ``proj`` (not .git) by relative path: its sha256."""
    out = {}
    for p in proj.rglob("*"):
        rel = p.relative_to(proj)
        if p.is_file() and not p.is_symlink() and rel.parts[0] != ".git":
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def dvc_ignored(proj: Path, paths: list[str]) -> set[str]:
    """Those of ``paths`` that ``.dvcignore`` excludes (DVC reads it with pathspec's
    gitwildmatch, as here)."""
    import pathspec

    lines = (proj / ".dvcignore").read_text().splitlines()
    spec = pathspec.PathSpec.from_lines("gitignore", lines)
    return {p for p in paths if spec.match_file(p)}


def git_visible(proj: Path) -> set[str]:
    """Untracked or changed paths git shows (what ``git add -A`` would take)."""
    out = git(proj, "status", "--porcelain", "--untracked-files=all")
    return {line[3:].strip('"') for line in out.splitlines()}


TEMPORARY_SUFFIXES = (".tmp",)


def temporary(rel: str) -> bool:
    """Whether ``rel`` is (or lies in) a temporary by its name (.gitignore's list)."""
    return any(part.endswith(TEMPORARY_SUFFIXES) for part in Path(rel).parts)


def kept_state(rel: str) -> bool:
    """Whether a run keeps ``rel``: not a temporary, and not a checkpoint (a run removes the
    checkpoints its newer one supersedes; the rerun's equality shows none was lost)."""
    return not temporary(rel) and "checkpoints" not in Path(rel).parts


def litter(proj: Path, reference: set[str], before: set[str]) -> list[str]:
    """Files in ``proj`` that neither were there ``before`` nor are in a finished run
    (``reference``): what a fault left behind."""
    return sorted(set(files(proj)) - reference - before)


def one_line(result: Result, *names: str) -> str:
    """The command failed with one error line, no traceback, naming each of ``names``."""
    lines = [line for line in result.stderr.splitlines() if ERROR_LINE.match(line)]
    assert result.returncode in (1, 2), (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def kept_bytes(cmd: Command, proj: Path) -> dict[str, bytes]:
    out = {}
    for pattern in cmd.kept:
        for p in sorted((proj / cmd.output).glob(pattern)):
            if p.is_file():
                out[str(p.relative_to(proj))] = p.read_bytes()
    return out


def check_litter(proj: Path, reference: set[str], before: set[str], dvc: bool = False
                 ) -> list[str]:
    """Nothing a fault left (beyond a finished run's files) is what git would pick up; with
    ``dvc``, after the rerun: nothing left is what DVC would hash either (a killed run's
    checkpoint, which the rerun resumes from, is state, not litter, until the rerun ends).
    Returns what is left."""
    left = litter(proj, reference, before)
    shown = git_visible(proj) & set(left)
    assert not shown, f"git would pick up what a fault left: {sorted(shown)}"
    missed = set(left) - dvc_ignored(proj, left) if dvc else set()
    assert not missed, f".dvcignore misses what a fault left: {sorted(missed)}"
    return left


def differences(a: object, b: object) -> object:
    """Where two of :attr:`Command.same`'s values differ (the keys of dicts, else both)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b), key=str)
                if a.get(k) != b.get(k)}
    return (a, b)


def check_rerun(cmd: Command, proj: Path, reference_proj: Path, reference: set[str]) -> str:
    """The rerun completes, equals the undisturbed run and leaves nothing but its products
    (temporaries of the faulted run removed, or ignored: said which)."""
    finished(cmd, proj)
    mine, theirs = cmd.same(proj), cmd.same(reference_proj)
    assert mine == theirs, f"{cmd.name}: the rerun differs: {differences(mine, theirs)}"
    left = check_litter(proj, reference, set(), dvc=True)
    return "rerun = undisturbed" + (f"; {len(left)} ignored temporaries kept" if left else "")


# ------------------------------------------------------------------------------------------------
# the faults
# ------------------------------------------------------------------------------------------------

def killed_when(cmd: Command, proj: Path, what: str, ready: Callable[[Path], bool]) -> None:
    """Start the command, SIGKILL it the moment ``ready(proj)`` holds; every process it started
    must be gone within 10 s (the lifetime chain)."""
    import psutil

    tag = f"faults-{proj}-{what}"
    log = proj.parent / f"{proj.name}.{cmd.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([PY, "-m", "lmrepro", *cmd.argv], cwd=proj,
                                env=env(LMREPRO_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                                stderr=out)
        deadline = time.monotonic() + cmd.timeout_s
        while not ready(proj):
            assert proc.poll() is None, f"{cmd.name} ended before {what}: {log.read_text()}"
            assert time.monotonic() < deadline, f"{cmd.name}: {what} never came"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def left() -> list[int]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if (p.status() != psutil.STATUS_ZOMBIE
                        and p.environ().get("LMREPRO_TEST_TAG") == tag):
                    found.append(p.pid)
        return found

    end = time.monotonic() + 10.0
    while left():
        assert time.monotonic() < end, f"{cmd.name} killed {what}: processes left {left()}"
        time.sleep(0.1)


def sigkill(cmd: Command, proj: Path, ref: Path, reference: set[str]) -> str:
    """One run killed at each point in turn (each run resuming the killed one's work), then a
    run to the end."""
    points = [(p, None) for p in cmd.kill_points] + list(cmd.kill_when)
    for point, ready in points:
        before = {p for p in files(proj) if kept_state(p)}
        if ready is None:
            result = run(cmd, proj, point)
            assert result.returncode == -signal.SIGKILL, (point, result.stderr[-3000:])
        else:
            killed_when(cmd, proj, point, ready)
        lost = before - set(files(proj))
        assert not lost, f"killed at {point}: lost {sorted(lost)}"
        check_litter(proj, reference, before)
    where = ", ".join(f"`{p}`" if r is None else p for p, r in points)
    return (f"killed at {where}: nothing lost, nothing git would pick up; "
            f"{check_rerun(cmd, proj, ref, reference)}")


@contextlib.contextmanager
def tmpfs(directory: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted on ``directory`` holding what it held (root only)."""
    held = directory.with_name(directory.name + ".held")
    if directory.exists():
        directory.rename(held)
    directory.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={max(size_bytes, 8192)}",
                    "tmpfs", str(directory)], check=True, capture_output=True)
    try:
        if held.exists():
            shutil.copytree(held, directory, dirs_exist_ok=True)
            shutil.rmtree(held)
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=False, capture_output=True)


def remount(directory: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(directory)], check=True,
                   capture_output=True)


def can_mount(tmp: Path) -> bool:
    probe = tmp / "probe"
    probe.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                        capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", str(probe)], check=False)
    return ok


def du(path: Path, page: int = 4096) -> int:
    """The bytes ``path`` takes on a tmpfs (each file whole pages)."""
    return sum(-(-p.stat().st_size // page) * page for p in path.rglob("*") if p.is_file())


def failed_and_kept(cmd: Command, proj: Path, *names: str) -> tuple[str, dict[str, str]]:
    """Run once expecting one error line naming ``names``; every file there before is still
    there, the ``kept`` products byte for byte."""
    before, kept = files(proj), kept_bytes(cmd, proj)
    line = one_line(run(cmd, proj), *names)
    after = files(proj)
    lost = {p for p in before if kept_state(p)} - set(after)
    assert not lost, f"{cmd.name}: lost {sorted(lost)}"
    assert kept_bytes(cmd, proj) == kept, f"{cmd.name}: a kept product changed"
    return line, before


def disk_full(cmd: Command, proj: Path, ref: Path, reference: set[str]) -> str:
    """The output on a tmpfs with less room than the run needs; then the room grows (remount)
    and the command runs again."""
    out = proj / cmd.output
    need = du(ref / cmd.output)
    with tmpfs(out, du(out) + need // 3 if out.exists() else need // 3):
        line, before = failed_and_kept(cmd, proj, "no space left on device")
        check_litter(proj, reference, set(before))
        remount(out, f"size={need * 4 + (1 << 20)}")
        rerun = check_rerun(cmd, proj, ref, reference)
    return f"one line (`{_short(line)}`), nothing lost; {rerun}"


def read_only(cmd: Command, proj: Path, ref: Path, reference: set[str]) -> str:
    """The output on a read-only file system; then remounted read-write and run again."""
    out = proj / cmd.output
    with tmpfs(out, du(ref / cmd.output) * 4 + (1 << 20)):
        remount(out, "ro")
        line, before = failed_and_kept(cmd, proj, "read-only file system")
        remount(out, "rw")
        check_litter(proj, reference, set(before))
        rerun = check_rerun(cmd, proj, ref, reference)
    return f"one line (`{_short(line)}`), nothing lost; {rerun}"


def damaged_input(cmd: Command, proj: Path, ref: Path, reference: set[str]) -> str:
    """The input file cut to half its length; then put back and run again."""
    path = proj / cmd.damage
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    line, before = failed_and_kept(cmd, proj, cmd.damage)
    check_litter(proj, reference, set(before))
    path.write_bytes(good)
    rerun = check_rerun(cmd, proj, ref, reference)
    return f"one line (`{_short(line)}`), nothing lost; {rerun}"


def _short(line: str, width: int = 90) -> str:
    text = ERROR_LINE.sub("", line).replace("|", "/").replace("`", "'")
    return text if len(text) <= width else text[: width - 3] + "..."


def run_matrix(cmd: Command, tmp: Path) -> dict[str, str]:
    """Every fault of :data:`FAULTS` on ``cmd``, each in a new project; the outcome of each."""
    template = new_project(tmp / "inputs", cmd)
    ref = copy_project(template, tmp / "undisturbed")
    finished(cmd, ref)
    reference = set(files(ref))
    faults = {"SIGKILL": sigkill, "disk full": disk_full, "read-only output": read_only,
              "damaged input": damaged_input}
    mountable = can_mount(tmp)
    for fault, how in faults.items():
        if fault in ("disk full", "read-only output") and not mountable:
            cmd.outcomes[fault] = "not run: no tmpfs can be mounted here (needs root)"
            continue
        proj = copy_project(template, tmp / fault.replace(" ", "-"))
        cmd.outcomes[fault] = how(cmd, proj, ref, reference)
    return cmd.outcomes
