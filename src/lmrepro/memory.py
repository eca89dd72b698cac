"""Peak memory of a run's process tree as RSS, PSS and USS, and the size of an idle torch process.

Every RGC run reports its peak memory "of the process tree as RSS, PSS and USS": RSS counts a
shared page (the torch libraries, shared-memory activation tensors) once in every process that
maps it, so a tree of K torch processes pays the runtime K times; PSS charges each process its
share of every shared page (the sum over a tree counts each page once); USS counts only the
pages no other process maps. :class:`MemorySampler` sums the three over this process and all its
descendants every ``interval_s`` in a background thread and keeps the maximum of each sum; the
multiprocessing fork server and resource tracker are left out (shared plumbing that outlives a
run, see :func:`multiprocessing_helper_pids`); their children (stage workers) still count.

:func:`idle_torch_process` measures, once per process, a fresh interpreter that imported torch
and ran one tensor operation: the price of one more torch runtime on this machine, so a report
can say how much of a multi-process run's memory is runtimes and how much is its own data.

PSS and USS come from ``/proc/<pid>/smaps_rollup`` (``psutil.memory_full_info``); where that is
unreadable the RSS is used for both and ``approximate`` is set.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from types import TracebackType

import psutil

KINDS = ("rss", "pss", "uss")


@dataclass(frozen=True)
class Memory:
    """Bytes by kind (see the module docstring)."""

    rss: int = 0
    pss: int = 0
    uss: int = 0

    def __add__(self, other: Memory) -> Memory:
        return Memory(self.rss + other.rss, self.pss + other.pss, self.uss + other.uss)

    def __sub__(self, other: Memory) -> Memory:
        return Memory(self.rss - other.rss, self.pss - other.pss, self.uss - other.uss)

    def peak(self, other: Memory) -> Memory:
        """The larger of each kind."""
        return Memory(max(self.rss, other.rss), max(self.pss, other.pss),
                      max(self.uss, other.uss))

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def multiprocessing_helper_pids() -> set[int]:
    """PIDs of this process's multiprocessing fork server and resource tracker, if running.

    They are shared plumbing that outlives any one run (started by the first async run, idle
    afterwards), so their own memory is not charged to a run; the fork server's children (the
    stage workers) still are."""
    pids: set[int] = set()
    try:
        from multiprocessing import forkserver, resource_tracker
        for obj, attr in ((forkserver._forkserver, "_forkserver_pid"),  # noqa: SLF001
                          (resource_tracker._resource_tracker, "_pid")):  # noqa: SLF001
            pid = getattr(obj, attr, None)
            if isinstance(pid, int):
                pids.add(pid)
    except Exception:  # noqa: BLE001 - private attributes; measuring must never fail a run
        pass
    return pids


def process_memory(proc: psutil.Process) -> tuple[Memory, bool]:
    """``(memory, approximate)`` of one process; ``approximate`` when PSS/USS were unreadable."""
    try:
        full = proc.memory_full_info()
        return Memory(int(full.rss), int(full.pss), int(full.uss)), False
    except (psutil.AccessDenied, AttributeError):
        rss = int(proc.memory_info().rss)
        return Memory(rss, rss, rss), True


def tree_processes(proc: psutil.Process | None = None, exclude_pids: set[int] | None = None
                   ) -> list[psutil.Process]:
    """``proc`` (default: this process) and every live descendant, without ``exclude_pids``
    (those processes themselves are left out, not their descendants)."""
    proc = proc or psutil.Process()
    exclude = exclude_pids or set()
    try:
        children = proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        children = []
    return [p for p in [proc, *children] if p.pid not in exclude]


def _sum_memory(procs: list[psutil.Process]) -> tuple[Memory, bool, int]:
    """``(memory, approximate, processes counted)`` over ``procs`` (vanished ones skipped)."""
    total, approximate, counted = Memory(), False, 0
    for p in procs:
        try:
            mem, approx = process_memory(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        total, approximate, counted = total + mem, approximate or approx, counted + 1
    return total, approximate, counted


class MemorySampler:
    """Context manager: ``with MemorySampler() as s: ...; s.peak`` (a :class:`Memory`).

    Every ``interval_s`` the RSS of the tree's processes is read (cheap: ``/proc/<pid>/statm``);
    the tree is listed again, and PSS and USS read (``smaps_rollup``, milliseconds per process
    here, a cost the measured run would share its cores with), when the RSS reaches a new high
    (by more than 1 %) and at least every ``full_interval_s``. ``children=False`` measures this
    process only (one data-parallel worker of many). ``max_processes`` is the largest number of
    processes one sample counted (e.g. 1 + W for an async RGC run of W workers: the
    multiprocessing helpers are not counted)."""

    def __init__(self, interval_s: float = 0.1, children: bool = True,
                 full_interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.full_interval_s = full_interval_s
        self.children = children
        self.peak = Memory()
        self.approximate = False
        self.samples = 0
        self.full_samples = 0
        self.max_processes = 0
        self._full_rss_high = 0
        self._last_full = -float("inf")
        self._known: list[psutil.Process] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    @property
    def peak_bytes(self) -> int:
        """Peak RSS (the figure ``ps`` and ``top`` show)."""
        return self.peak.rss

    def _processes(self) -> list[psutil.Process]:
        if self.children:
            return tree_processes(self._proc, multiprocessing_helper_pids())
        return [self._proc]

    def sample(self) -> Memory:
        """A full sample (RSS, PSS, USS) of the tree now; updates the peaks. Safe to call while
        the sampling thread runs."""
        procs = self._processes()
        self._known = procs
        mem, approx, counted = _sum_memory(procs)
        with self._lock:
            self._record_full(mem, approx, counted)
        return mem

    def _record_full(self, mem: Memory, approx: bool, counted: int) -> None:
        self.max_processes = max(self.max_processes, counted)
        self.peak = self.peak.peak(mem)
        self.approximate = self.approximate or approx
        self.samples += 1
        self.full_samples += 1
        self._full_rss_high = max(self._full_rss_high, mem.rss)
        self._last_full = time.monotonic()

    def _tick(self) -> None:
        """The RSS now, of the processes the last full sample found (listing a tree's processes
        walks every process of the machine, about a millisecond); a full sample when the RSS is
        a new high or the last full sample is older than ``full_interval_s``."""
        procs = self._known
        rss, counted = 0, 0
        for p in procs:
            try:
                rss += int(p.memory_info().rss)
                counted += 1
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        if rss > 1.01 * self._full_rss_high or \
                time.monotonic() - self._last_full >= self.full_interval_s:
            self.sample()
            return
        with self._lock:
            self.max_processes = max(self.max_processes, counted)
            self.peak = Memory(max(self.peak.rss, rss), self.peak.pss, self.peak.uss)
            self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def start(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Memory:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.peak

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


_IDLE_TORCH = """
import json, torch, psutil
torch.ones(8) @ torch.ones(8)
m = psutil.Process().memory_full_info()
print(json.dumps({"rss": m.rss, "pss": m.pss, "uss": m.uss}))
"""


@functools.lru_cache(maxsize=1)
def idle_torch_process() -> dict[str, int]:
    """RSS, PSS and USS of a fresh interpreter that imported torch and ran one operation (measured
    once per process, on this machine): what one more torch runtime costs."""
    out = subprocess.run([sys.executable, "-c", _IDLE_TORCH], capture_output=True, text=True,
                         timeout=120, check=True)
    return {k: int(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def memory_fields(peak: Memory | None = None, *, processes_peaks: list[Memory] | None = None
                  ) -> dict[str, object]:
    """The memory fields of a :class:`lmrepro.results.RunSummary` from the run's peak (or the sum
    of several processes' peaks), with the idle torch process of this machine."""
    total = sum(processes_peaks, Memory()) if processes_peaks is not None else peak
    assert total is not None
    return {"peak_rss_bytes": total.rss, "peak_pss_bytes": total.pss,
            "peak_uss_bytes": total.uss, "idle_torch_process": idle_torch_process()}
