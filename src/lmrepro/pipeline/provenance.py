"""Facts about where and from what a report was made: the git commit, the software versions,
the machine (with its CPU model). Standard library only, so the notebook runner can stamp every
report with them (:mod:`lmrepro.pipeline.render`) and the index can record them
(:mod:`lmrepro.pipeline.report`)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("lmrepro", "torch", "numpy", "scipy", "pandas", "dvc")


def _run_git(repo_dir: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True,
                              text=True, timeout=30, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


#: written by ``dvc repro`` itself: not a change to the code or parameters of a run
PIPELINE_LOCK = "dvc.lock"
#: the stages' headline metrics (:mod:`lmrepro.pipeline.headline`): tracked by git so that each
#: commit and experiment carries them, and rewritten by the run itself
HEADLINE_METRICS = "metrics"


def git_info(repo_dir: str | os.PathLike) -> dict[str, Any]:
    """``{"commit", "dirty", "available", "note"}`` of the git checkout at ``repo_dir``.

    The commit comes from ``git rev-parse HEAD``; ``dirty`` is True when tracked files differ from
    it (``git --no-optional-locks status --porcelain --untracked-files=no``, which takes no lock
    and writes nothing), other than ``dvc.lock`` and the headline metrics under ``metrics/``:
    the run itself writes them (what it did, what it found), so a run from a clean checkout
    stays clean. Outside a
    repository, without commits, or without git, ``commit`` and ``dirty`` are None and ``note``
    says why.
    """
    repo_dir = Path(repo_dir)
    head = _run_git(repo_dir, "rev-parse", "--verify", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None, "available": False,
                "note": "git is not installed or did not answer"}
    if head.returncode != 0:
        inside = _run_git(repo_dir, "rev-parse", "--is-inside-work-tree")
        in_repo = inside is not None and inside.stdout.strip() == "true"
        note = ("git repository without commits" if in_repo
                else f"{repo_dir} is not inside a git repository")
        return {"commit": None, "dirty": None, "available": False, "note": note}
    status = _run_git(repo_dir, "--no-optional-locks", "status", "--porcelain",
                      "--untracked-files=no", "--", ".", f":(exclude){PIPELINE_LOCK}",
                      f":(exclude){HEADLINE_METRICS}")
    dirty = None if status is None or status.returncode != 0 else bool(status.stdout.strip())
    return {"commit": head.stdout.strip(), "dirty": dirty, "available": True, "note": ""}


def git_remote_url(repo_dir: str | os.PathLike, remote: str = "origin") -> str | None:
    """The network URL of ``remote`` of the checkout at ``repo_dir``; None without one, or when
    the remote is a local path (a clone of a clone): no reader can follow that to the code."""
    out = _run_git(Path(repo_dir), "remote", "get-url", remote)
    url = out.stdout.strip() if out is not None and out.returncode == 0 else ""
    return url if re.match(r"(https?|ssh|git)://|[\w.-]+@[\w.-]+:", url) else None


def package_versions(packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Python and package versions (``importlib.metadata``; ``"not installed"`` if absent)."""
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _total_memory_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil missing or unsupported platform: fall back to sysconf
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            return None


def cpu_model(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    try:
        for line in Path(cpuinfo).read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_info() -> dict[str, Any]:
    """Platform, CPU model, CPU count (and usable cores) and total memory of this machine."""
    mem = _total_memory_bytes()
    return {
        "platform": platform.platform(), "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
        "python_implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(), "usable_cores": usable_cores(),
        "memory_total_bytes": mem,
        "memory_total_gib": None if mem is None else round(mem / (1 << 30), 2),
    }
