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

**Exact peaks.** A sampled sum misses what happens between two samples (a burst that is freed,
or a process that starts and exits, within one interval). Two figures do not depend on sampling:

* *high-water marks*: the kernel keeps each process's peak RSS (``VmHWM`` in
  ``/proc/<pid>/status``). The sampler reads it for every process of the tree at every sample
  (the cheap RSS tick reads it too: the same file gives ``VmRSS``) and at the end; a process
  that exited between two reads keeps its last read value (a lower bound of its own peak), and
  the children this process reaped are covered by ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` (the
  largest peak RSS of any reaped child, kept by the kernel after it exits; counted when it grew
  during the run). Their sum, ``hwm_sum_bytes``, is an **upper bound** of the tree's
  simultaneous peak RSS (the processes need not peak at the same time; shared pages count in
  every process, as in RSS), exact for each process read at its end or reaped here.
* *a cgroup peak* (:class:`RunCgroup`): the run's processes placed in a child memory cgroup,
  the kernel records the peak of their charged memory (cgroup v2 ``memory.peak``, kernel >=
  5.19; cgroup v1 ``memory.max_usage_in_bytes``). It counts every page once, whenever charged,
  page cache the run brought in included, and needs write access to the cgroup hierarchy
  (root); where that is refused the reason is reported and the figure is None.

:meth:`MemorySampler.exact` returns both (for a run summary's ``details``), beside the sampled
``peak`` whose fields keep their meaning.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

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


def status_memory(pid: int) -> tuple[int, int] | None:
    """``(VmRSS, VmHWM)`` in bytes of process ``pid`` from ``/proc/<pid>/status``; None when the
    process is gone, has no memory map (a zombie, a kernel thread) or /proc is not there."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rss = hwm = None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return (rss, hwm) if rss is not None and hwm is not None else None


def reaped_children_max_rss() -> int:
    """The largest peak RSS (bytes) of any child this process has reaped, and of their reaped
    descendants (``getrusage(RUSAGE_CHILDREN).ru_maxrss``, KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroups(pid: int | str = "self") -> dict[str, str]:
    """This process's cgroup path by controller (``""``: the cgroup v2 hierarchy)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


class RunCgroup:
    """A child memory cgroup of this process's own, for one run: the kernel's peak of the memory
    charged to the processes placed in it (:meth:`add`; their children join by themselves).

    cgroup v2 is tried first (``memory.peak``: the memory controller must be enabled for the
    children of this process's cgroup, and ``memory.peak`` exists from kernel 5.19), then v1
    (``memory.max_usage_in_bytes`` of the ``memory`` hierarchy). ``kind`` says which file is
    read (None: neither could be made, ``reason`` says why: not root, no memory controller,
    ...). Pages are charged to the cgroup of the process that first touches them: a process
    should be placed before it allocates (right after it starts). ``close`` moves what is left
    to the parent cgroup and removes the child."""

    V2, V1 = "cgroup v2 memory.peak", "cgroup v1 memory.max_usage_in_bytes"

    def __init__(self, label: str = "lmrepro-run", root: Path = CGROUP_ROOT) -> None:
        self.path: Path | None = None
        self.parent: Path | None = None
        self.kind: str | None = None
        self.reason = ""
        self._peak_file = ""
        name = f"{label}-{os.getpid()}-{time.monotonic_ns()}"
        own = _own_cgroups()
        reasons = []
        v2_root = root if (root / "cgroup.controllers").exists() else root / "unified"
        if "" in own and (v2_root / "cgroup.controllers").exists():
            base = v2_root / own[""].lstrip("/")
            why = self._try(base, name, "memory.peak", v2=True)
            if why is None:
                self.kind = self.V2
                return
            reasons.append(f"v2 ({base}): {why}")
        else:
            reasons.append("v2: no cgroup v2 hierarchy")
        if "memory" in own and (root / "memory").is_dir():
            base = root / "memory" / own["memory"].lstrip("/")
            why = self._try(base, name, "memory.max_usage_in_bytes", v2=False)
            if why is None:
                self.kind = self.V1
                return
            reasons.append(f"v1 ({base}): {why}")
        else:
            reasons.append("v1: no memory controller hierarchy")
        self.reason = "; ".join(reasons)

    def _try(self, base: Path, name: str, peak_file: str, v2: bool) -> str | None:
        """Make ``base/name`` with ``peak_file``; None on success, else why not."""
        if v2:
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError as exc:
                return f"cannot read cgroup.subtree_control ({exc.strerror})"
            if "memory" not in enabled:
                try:    # refused (EBUSY) when the cgroup holds processes: no internal processes
                    (base / "cgroup.subtree_control").write_text("+memory")
                except OSError as exc:
                    return ("the memory controller is not enabled for child cgroups and cannot "
                            f"be ({exc.strerror})")
        path = base / name
        try:
            path.mkdir()
        except OSError as exc:
            return f"cannot create a child cgroup ({exc.strerror}; needs root)"
        if not (path / peak_file).exists():
            with contextlib.suppress(OSError):
                path.rmdir()
            return f"no {peak_file} (kernel too old?)"
        self.path, self.parent, self._peak_file = path, base, peak_file
        return None

    @property
    def available(self) -> bool:
        return self.kind is not None

    def add(self, pid: int) -> None:
        """Place process ``pid`` (and so the children it starts afterwards) in the cgroup."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(pid))

    def peak_bytes(self) -> int | None:
        """The kernel's peak of the cgroup's charged memory so far (None when unavailable)."""
        if self.path is None:
            return None
        try:
            return int((self.path / self._peak_file).read_text().split()[0])
        except (OSError, ValueError):
            return None

    def info(self) -> dict[str, Any]:
        return {"source": self.kind, "peak_bytes": self.peak_bytes(),
                "unavailable_because": None if self.available else self.reason}

    def close(self) -> None:
        """Move the processes still in the cgroup to the parent, then remove it."""
        if self.path is None or self.parent is None:
            return
        for _ in range(50):
            with contextlib.suppress(OSError):
                for pid in (self.path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (self.parent / "cgroup.procs").write_text(pid)
            try:
                self.path.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        self.path = None

    def __enter__(self) -> RunCgroup:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


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
    multiprocessing helpers are not counted).

    Beside the sampled peak, every read also takes each process's high-water mark (``VmHWM``),
    and ``cgroup`` (a :class:`RunCgroup` the run's processes were placed in) is read at the end:
    :meth:`exact` (module docstring, "Exact peaks")."""

    def __init__(self, interval_s: float = 0.1, children: bool = True,
                 full_interval_s: float = 1.0, cgroup: RunCgroup | None = None) -> None:
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
        self.cgroup = cgroup
        self.hwm: dict[int, int] = {}       # pid -> the highest VmHWM read (bytes)
        self._seen: dict[int, psutil.Process] = {}
        self._reaped_start = 0
        self._reaped_end = 0
        self._cgroup_info: dict[str, Any] | None = None

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
            for p in procs:
                self._seen.setdefault(p.pid, p)
                self._read_hwm(p.pid)
            self._record_full(mem, approx, counted)
        return mem

    def _read_hwm(self, pid: int) -> int | None:
        """Read ``pid``'s status, keep its high-water mark; its RSS (None: gone)."""
        got = status_memory(pid)
        if got is None:
            return None
        rss, hwm = got
        self.hwm[pid] = max(self.hwm.get(pid, 0), hwm)
        return rss

    def _record_full(self, mem: Memory, approx: bool, counted: int) -> None:
        self.max_processes = max(self.max_processes, counted)
        self._note(mem)
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
            with self._lock:
                got = self._read_hwm(p.pid)     # /proc/<pid>/status: VmRSS and VmHWM
            if got is None:
                try:
                    got = int(p.memory_info().rss)
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    continue
            rss += got
            counted += 1
        if rss > 1.01 * self._full_rss_high or \
                time.monotonic() - self._last_full >= self.full_interval_s:
            self.sample()
            return
        with self._lock:
            self.max_processes = max(self.max_processes, counted)
            self._note(Memory(rss, 0, 0))     # RSS only: PSS and USS keep their peaks
            self.samples += 1

    def _note(self, mem: Memory) -> None:
        """Keep the peaks of a sample (called under the lock; a subclass keeps more)."""
        self.peak = self.peak.peak(mem)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def start(self) -> MemorySampler:
        self._reaped_start = reaped_children_max_rss()
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Memory:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        with self._lock:
            for pid, p in self._seen.items():   # processes that left the tree but still live
                with contextlib.suppress(psutil.Error):
                    if p.is_running():          # the same process (not a reused pid)
                        self._read_hwm(pid)
        self._reaped_end = reaped_children_max_rss()
        if self.cgroup is not None:
            self._cgroup_info = self.cgroup.info()
        return self.peak

    @property
    def reaped_max_rss(self) -> int:
        """The largest peak RSS of a child reaped by this process during the run (0: none
        larger than one reaped before it started)."""
        return self._reaped_end if self._reaped_end > self._reaped_start else 0

    @property
    def hwm_sum_bytes(self) -> int:
        """Sum of the high-water marks of every process seen, plus :attr:`reaped_max_rss`: an
        upper bound of the tree's simultaneous peak RSS (module docstring)."""
        return sum(self.hwm.values()) + self.reaped_max_rss

    def exact(self) -> dict[str, Any]:
        """The peaks that do not depend on sampling (module docstring, "Exact peaks"), for a run
        summary's ``details``: ``hwm_sum_bytes`` (an upper bound of the simultaneous peak RSS
        of the tree), ``hwm_by_process`` (pid -> VmHWM bytes), ``reaped_children_max_rss_bytes``,
        ``cgroup`` (``source``: which kernel figure was read, or None with
        ``unavailable_because``; ``peak_bytes``) and ``sampled_peak`` (the sampled RSS/PSS/USS
        sums, for comparison). Complete after :meth:`stop`."""
        with self._lock:
            by_process = {str(pid): v for pid, v in sorted(self.hwm.items())}
        cg = self._cgroup_info if self._cgroup_info is not None else (
            self.cgroup.info() if self.cgroup is not None else
            {"source": None, "peak_bytes": None, "unavailable_because": "no cgroup given"})
        return {"hwm_sum_bytes": self.hwm_sum_bytes if self.hwm else None,
                "hwm_sum_is": "upper bound of the simultaneous peak RSS of the tree",
                "hwm_by_process": by_process, "hwm_processes": len(by_process),
                "reaped_children_max_rss_bytes": self.reaped_max_rss,
                "cgroup": cg, "sampled_peak": self.peak.to_dict()}

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
