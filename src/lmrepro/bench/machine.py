"""What a benchmark ran on: CPU, cores, memory, software versions, date and load."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (or :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    """SIMD-relevant CPU flags (avx2, fma, avx512*, amx*) from ``/proc/cpuinfo``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(x for x in flags if x.startswith(("avx", "fma", "amx")))
    except OSError:
        pass
    return []


def memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (empty where unavailable)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_info() -> dict[str, Any]:
    """A JSON-ready record of the machine and software, stamped with the current UTC time."""
    import numpy as np
    import torch

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cores": os.cpu_count(),
        "usable_cores": affinity,
        "memory_bytes": memory_bytes(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "torch_threads_default": torch.get_num_threads(),
        "torch_parallel_backend": _parallel_backend(torch),
        "loadavg": load_average(),
    }


def _parallel_backend(torch: Any) -> str:
    info = torch.__config__.parallel_info()
    for line in info.splitlines():
        if "parallel backend" in line.lower():
            return line.split(":", 1)[1].strip()
    return "unknown"


def busy_processes(min_cpu_percent: float = 20.0, exclude_pids: set[int] | None = None,
                   sample_s: float = 0.5) -> list[dict[str, Any]]:
    """Other processes using more than ``min_cpu_percent`` of a core right now (a benchmark
    should run on a quiet machine; the list goes into its results)."""
    import time

    import psutil

    exclude = set(exclude_pids or ()) | {os.getpid()}
    procs = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            p.cpu_percent(None)
            procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    time.sleep(sample_s)
    busy = []
    for p in procs:
        try:
            cpu = p.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cpu >= min_cpu_percent and p.pid not in exclude:
            cmd = " ".join(p.info.get("cmdline") or [p.info.get("name") or ""])[:160]
            busy.append({"pid": p.pid, "cpu_percent": round(cpu, 1), "cmd": cmd})
    return busy
