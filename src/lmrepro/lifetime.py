"""Process lifetimes: no process of a run outlives the process that owns it.

Under ``dvc repro`` a training stage is a chain of processes, several of them in sessions of their
own (so a terminal's signals and a process-group kill do not reach them)::

    dvc repro
      └ $SHELL -c "lmrepro notebook ..."      (bash execs the command; dash does not)
          └ lmrepro notebook                   papermill, the stage process
              └ ipykernel kernel               own session (jupyter_client)
                  ├ torchrun agent             own session (scape.train.launch)
                  │   └ train-scape workers    own sessions (torch elastic)
                  └ multiprocessing forkserver
                      └ RGC async stage workers

Without the links below, killing ``dvc repro`` (or the stage process) with SIGKILL leaves the
rest running: they keep writing into the run directories while the next ``dvc repro`` starts a
second writer. Each link ends with the one above it:

=================================  =============================================================
link                               mechanism
=================================  =============================================================
dvc → ``lmrepro notebook``         :func:`bind_to_pipeline` (under DVC only: ``DVC_STAGE`` set):
                                   a parent-death signal (SIGTERM), and a watchdog on dvc itself
                                   when the shell in between did not exec; SIGTERM kills the
                                   kernel's process group, then becomes ``SystemExit`` (clean-up
                                   runs) with a hard deadline
notebook → kernel                  that SIGTERM; when the notebook is SIGKILLed,
                                   :func:`die_with_report_runner`, run by the kernel before any
                                   cell (``exec_lines``, lmrepro.pipeline.notebook's
                                   ``prepare_report_kernel``): a watchdog on the runner's PID (a
                                   pidfd, at once; ipykernel's
                                   own parent poller would take up to 1 s, long enough for a
                                   small run to train on and write more checkpoints)
kernel → torchrun agent            :func:`guarded_command`: an exec wrapper that arms SIGKILL as
                                   the parent-death signal, then execs torchrun
agent → workers                    :func:`die_with_torchrun_agent` first in ``train-scape``
kernel → RGC stage workers         :func:`die_with_multiprocessing_parent` first thing in a
                                   stage worker: a watchdog on the kernel's PID (a pidfd), not
                                   on the fork server, which lives as long as its children
forkserver                         multiprocessing's own: EOF on its "alive" pipe once the
                                   kernel and the stage workers are gone
=================================  =============================================================

The parent-death signal is Linux's ``prctl(PR_SET_PDEATHSIG)``: the kernel delivers it when the
thread that forked the process exits, so it cannot be missed the way a polling loop can; it
survives ``execve``, and a process checks after arming that its parent is still the expected one
(the parent may have died in between). It fires when the *thread* that started the child ends:
every launcher here starts and waits for its child in one thread. Elsewhere (macOS) a watchdog
thread polls the parent instead. ``python -m lmrepro.lifetime --parent PID -- CMD ...`` is the
exec wrapper. Even if a link failed, the run-directory lock (:mod:`lmrepro.results`) stops a
second writer with a message naming the PID of the first.

Also here: :func:`scratch_dir`, a temporary directory that lives as long as its process (a
SIGKILLed process's directory is removed by the next one), and the fault points: the one way a
test injects a fault into a run (:func:`fault_point`, :func:`fault_armed`; ``LMREPRO_FAULT_AT``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

FAULT_ENV = "LMREPRO_FAULT_AT"
#: what an armed fault point does (``POINT=ACTION`` in :data:`FAULT_ENV`; ``POINT`` alone: kill)
FAULT_ACTIONS = ("kill", "exit", "raise", "hang")
FAULT_EXIT_CODE = 3     # the exit status of a fault point armed with "exit"
HANG_S = 600.0          # how long a fault point armed with "hang" sleeps (then it raises)
#: the PID of ``lmrepro notebook``, set in the environment of the kernel it starts
RUNNER_PID_ENV = "LMREPRO_RUNNER_PID"
PR_SET_PDEATHSIG = 1
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "busybox"})
HARD_EXIT_S = 10.0      # after SIGTERM: clean-up gets this long, then the process is killed


# ------------------------------------------------------------------------------------------------
# fault points: the tests' one way to inject a fault (off unless a test sets LMREPRO_FAULT_AT)
# ------------------------------------------------------------------------------------------------

class InjectedFault(RuntimeError):
    """Raised by a fault point armed with the action ``raise``."""


def armed_fault() -> tuple[str, str] | None:
    """The fault point a test armed and its action, from ``$LMREPRO_FAULT_AT`` (``POINT`` or
    ``POINT=ACTION``, ACTION in :data:`FAULT_ACTIONS`, default ``kill``); None when unset."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    point, sep, action = spec.rpartition("=")
    if sep and point and action in FAULT_ACTIONS:
        return point, action
    return spec, "kill"


def fault_armed(name: str) -> bool:
    """Whether the fault point ``name`` is armed: for the points whose fault is a wrong value
    the caller makes itself (``scape-nan-loss@<step>:rank<r>``: a NaN loss;
    ``rgc-stage<k>[-backward]-mislabel@<step>``: an RGC message tagged with the next step); the
    action is ignored."""
    armed = armed_fault()
    return armed is not None and armed[0] == name


def fault_point(name: str, hang_s: float = HANG_S) -> None:
    """Fail here when ``$LMREPRO_FAULT_AT`` arms ``name`` (tests only; nothing otherwise).

    Actions: ``kill`` (SIGKILL this process, the default), ``exit`` (``os._exit(3)``, no clean-up),
    ``raise`` (:class:`InjectedFault`), ``hang`` (sleep ``hang_s``, then raise). Points:
    ``replace:<file name>`` (an atomic write, new file complete but not yet renamed),
    ``checkpoint-published@<step>`` (right after a checkpoint became the latest), ``evaluate``
    (after the first batch of an evaluation), ``scape-step@<step>:rank<r>`` (a SCAPE rank before
    a step), ``rgc-stage<k>@<step>`` and ``rgc-stage<k>-backward@<step>`` (an RGC async stage at
    the start of a step, before its backward). The environment reaches torchrun's workers as it
    is; an RGC async run hands it to its stage workers (:func:`fault_spec`)."""
    armed = armed_fault()
    if armed is None or armed[0] != name:
        return
    action = armed[1]
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        return
    if action == "exit":
        os._exit(FAULT_EXIT_CODE)
    if action == "hang":
        time.sleep(hang_s)
    raise InjectedFault(f"injected fault at {name}")


def fault_spec() -> str | None:
    """``$LMREPRO_FAULT_AT`` as it is now, for a process that does not inherit this one's
    environment (a fork server started earlier); pass it to :func:`set_fault_spec` there."""
    return os.environ.get(FAULT_ENV)


def set_fault_spec(spec: str | None) -> None:
    """Arm ``spec`` (from :func:`fault_spec`) in this process, or disarm every point (None)."""
    if spec:
        os.environ[FAULT_ENV] = spec
    else:
        os.environ.pop(FAULT_ENV, None)


# ------------------------------------------------------------------------------------------------
# parent-death signals and watchdogs
# ------------------------------------------------------------------------------------------------

def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def exit_with(pid: int, sig: int = signal.SIGTERM, poll_s: float = 0.5) -> threading.Thread:
    """Send ``sig`` to this process when process ``pid`` ends (a daemon watchdog thread).

    Waits on a pidfd where Linux has them (woken the moment ``pid`` exits), else polls."""
    me = os.getpid()

    def watch() -> None:
        fd = None
        with contextlib.suppress(OSError, AttributeError):
            fd = os.pidfd_open(pid)
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll(None):
                pass
            os.close(fd)
        else:
            while pid_alive(pid):
                time.sleep(poll_s)
        os.kill(me, sig)

    thread = threading.Thread(target=watch, name=f"lmrepro-exit-with-{pid}", daemon=True)
    thread.start()
    return thread


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> bool:
    """Have ``sig`` sent to this process when its parent ends; returns True when the kernel's
    parent-death signal is armed (Linux), False when a watchdog thread polls instead.

    ``expected_parent``: the parent's PID as the parent knew it; if the parent already died
    (this process was re-parented before arming), ``sig`` is sent now."""
    parent = os.getppid() if expected_parent is None else expected_parent
    armed = _set_pdeathsig(sig)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    if not armed:
        exit_with(parent, sig)
    return armed


def die_with_torchrun_agent() -> bool:
    """Under torchrun (``TORCHELASTIC_RUN_ID`` set), :func:`die_with_parent` (SIGKILL): a worker
    whose agent is gone has no rendezvous and no one to report to. False elsewhere."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    return die_with_parent(signal.SIGKILL)


def die_with_multiprocessing_parent(sig: int = signal.SIGKILL) -> bool:
    """In a ``multiprocessing`` child, have ``sig`` sent to it when the process that started it
    ends; False outside one.

    Under ``forkserver`` the OS parent is the fork server, which is no use: the server lives as
    long as any of its children holds its "alive" pipe, and every child does, so the children
    and the server would keep each other alive after the run's process died. The process that
    asked for the child (``multiprocessing.parent_process()``) is watched instead."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return False
    if parent.pid == os.getppid():           # spawn: the starter is the OS parent
        die_with_parent(sig, expected_parent=parent.pid)
    else:
        exit_with(parent.pid, sig)
    return True


def die_with_report_runner(sig: int = signal.SIGKILL) -> int | None:
    """In a kernel started by ``lmrepro notebook`` (:data:`RUNNER_PID_ENV` set), have ``sig``
    sent to this process the moment the runner ends; returns the PID watched (None elsewhere).

    The kernel runs in a session of its own and its parent-death link is ipykernel's poller,
    which looks once a second: after a SIGKILL of the runner a training cell would go on for up
    to a second. A pidfd watchdog ends it at once (its stage workers follow their own links)."""
    value = os.environ.get(RUNNER_PID_ENV, "")
    if not value.isdigit():
        return None
    pid = int(value)
    exit_with(pid, sig)
    return pid


def kill_children() -> list[int]:
    """SIGKILL this process's children, each with its whole process group when it leads one of
    its own (a kernel in its own session takes its fork server and stage workers with it; its
    torchrun agent follows by its parent-death signal). Returns the PIDs signalled."""
    try:
        import psutil

        children = psutil.Process().children()
    except Exception:  # noqa: BLE001 - best effort: the parent-death links remain
        return []
    own_group, killed = os.getpgrp(), []
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(child.pid)
            if group == child.pid and group != own_group:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(child.pid, signal.SIGKILL)
            killed.append(child.pid)
    return killed


def exit_on_sigterm(hard_exit_s: float = HARD_EXIT_S, children: bool = False) -> None:
    """Turn SIGTERM into ``SystemExit(143)`` so ``finally`` blocks and context managers clean up;
    a timer kills the process if that takes longer than ``hard_exit_s``. ``children``: first
    SIGKILL the children (:func:`kill_children`), so the work stops at once instead of after a
    graceful shutdown the children cannot answer while busy. Main thread only."""

    def on_term(signum: int, _frame: object) -> None:
        if children:
            kill_children()
        timer = threading.Timer(hard_exit_s, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
        signal.signal(signum, signal.SIG_DFL)        # a second SIGTERM ends it at once
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


def pipeline_owners() -> list[int]:
    """The processes whose end must end this stage process: the parent, and also the
    grandparent when the parent is the shell DVC ran the stage's command in (``$SHELL -c CMD``,
    a shell that did not exec the command)."""
    ppid = os.getppid()
    owners = [ppid]
    try:
        import psutil

        parent = psutil.Process(ppid)
        if parent.name() in SHELLS and "-c" in parent.cmdline()[1:]:
            owners.append(parent.ppid())
    except Exception:  # noqa: BLE001 - best effort: the parent is watched in any case
        pass
    return owners


def bind_to_pipeline() -> list[int]:
    """Under ``dvc repro`` (``DVC_STAGE`` set), end this process (SIGTERM, then SystemExit) when
    DVC ends; returns the PIDs watched ([] outside DVC).

    Outside DVC nothing changes: a command typed in a terminal keeps the usual rules (SIGHUP,
    ``nohup``), and its own children still die with it (the other links of the chain)."""
    if "DVC_STAGE" not in os.environ:
        return []
    owners = pipeline_owners()
    if threading.current_thread() is threading.main_thread():
        # the kernel is busy in a cell and cannot answer a shutdown request: killed at once
        # (every product is written atomically and every run resumes from its checkpoint)
        exit_on_sigterm(children=True)
    die_with_parent(signal.SIGTERM, expected_parent=owners[0])
    for pid in owners[1:]:
        if pid > 1:
            exit_with(pid, signal.SIGTERM)
    return owners


def guarded_command(cmd: list[str], sig: str = "KILL") -> list[str]:
    """``cmd`` behind the exec wrapper: it will receive SIG``sig`` when the calling process (the
    thread that starts it) ends. Use for programs that are not ours (torchrun)."""
    return [sys.executable, "-m", "lmrepro.lifetime", "--parent", str(os.getpid()),
            "--signal", sig, "--", *cmd]


def main(argv: list[str] | None = None) -> int:
    """``python -m lmrepro.lifetime --parent PID [--signal KILL] -- CMD ...``: arm the
    parent-death signal, check the parent is still PID, and exec CMD (which keeps the signal)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lmrepro.lifetime", description=main.__doc__)
    p.add_argument("--parent", type=int, required=True, help="PID of the expected parent")
    p.add_argument("--signal", default="KILL", help="signal name without SIG (default KILL)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no command given")
    try:
        sig = signal.Signals[f"SIG{args.signal.upper().removeprefix('SIG')}"]
    except KeyError:
        p.error(f"--signal {args.signal!r}: not a signal name (e.g. KILL, TERM)")
    die_with_parent(sig, expected_parent=args.parent)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


# ------------------------------------------------------------------------------------------------
# scratch directories that do not outlive their process
# ------------------------------------------------------------------------------------------------

def _scratch_prefix(tag: str) -> str:
    return f"lmrepro-{tag}-"


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def owner_tag() -> str:
    """``<pid>-<host>``: the owner written into a temporary's name, so that the next process
    can tell a killed owner's temporaries (:func:`owner_gone`) from a live one's."""
    return f"{os.getpid()}-{_host()}"


def owner_gone(tag: str) -> bool:
    """Whether the owner ``tag`` (:func:`owner_tag`, possibly followed by ``-<more>``) is a
    process of this host that has ended; another host's owners are never called gone."""
    pid_text, _, rest = tag.partition("-")
    return (pid_text.isdigit() and (rest == _host() or rest.startswith(_host() + "-"))
            and int(pid_text) != os.getpid() and not pid_alive(int(pid_text)))


def stale_scratch(tag: str, base: str | os.PathLike | None = None) -> list[Path]:
    """The scratch directories of ``tag`` under ``base`` whose process (on this host) is gone.
    Another host's (a shared temporary directory) are not listed."""
    base = Path(base or tempfile.gettempdir())
    prefix = _scratch_prefix(tag)
    stale = []
    for d in sorted(base.glob(prefix + "*")):
        if owner_gone(d.name[len(prefix):]):
            stale.append(d)
    return stale


def sweep_scratch(tag: str, base: str | os.PathLike | None = None) -> list[Path]:
    """Remove the scratch directories of ``tag`` whose process (on this host) is gone; returns
    them (:func:`stale_scratch`)."""
    removed = stale_scratch(tag, base)
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return removed


@contextlib.contextmanager
def scratch_dir(tag: str, base: str | os.PathLike | None = None,
                suffix: str = "") -> Iterator[Path]:
    """A private temporary directory ``<base>/lmrepro-<tag>-<pid>-<host>-XXXX<suffix>`` (base:
    the system's temporary directory), removed on exit; those left by killed processes of this
    host are removed first. Inside a repository, the suffix ``.tmp`` (the one of every temporary
    name, :mod:`lmrepro.io`) keeps it out of git and DVC (``.gitignore``, ``.dvcignore``:
    ``tests/test_faults.py`` checks every temporary name)."""
    base = Path(base or tempfile.gettempdir())
    sweep_scratch(tag, base)
    path = Path(tempfile.mkdtemp(prefix=f"{_scratch_prefix(tag)}{owner_tag()}-",
                                 suffix=suffix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
