"""Peak resident memory of the whole process tree, sampled in a background thread.

DESIGN.md asks for peak memory per run, "resident set, and the process tree for multi-process
executors". :class:`PeakRSSSampler` sums the RSS of this process and all its descendants
(``psutil.Process.children(recursive=True)``) every ``interval_s`` and keeps the maximum; the
multiprocessing fork server and resource tracker themselves are left out (shared plumbing, see
:func:`multiprocessing_helper_pids`).
Shared pages (shared-memory activation tensors, the torch library) are counted once per process,
as RSS does; that over-counts sharing and is the convention ``ps``/``top`` users expect.
"""

from __future__ import annotations

import threading
from types import TracebackType

import psutil


def multiprocessing_helper_pids() -> set[int]:
    """PIDs of this process's multiprocessing fork server and resource tracker, if running.

    They are shared plumbing that outlives any one run (started by the first async run, idle
    afterwards), so their own RSS is not charged to a run; the fork server's children (the stage
    workers) still are."""
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


def tree_rss_bytes(proc: psutil.Process | None = None, exclude_pids: set[int] | None = None
                   ) -> int:
    """RSS of ``proc`` (default: this process) plus every live descendant, in bytes.
    ``exclude_pids`` leaves out those processes themselves (not their descendants)."""
    proc = proc or psutil.Process()
    exclude = exclude_pids or set()
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        if p.pid in exclude:
            continue
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


class PeakRSSSampler:
    """Context manager: ``with PeakRSSSampler() as s: ...; s.peak_bytes``."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()
        self.exclude_pids: set[int] = set()

    def sample(self) -> int:
        rss = tree_rss_bytes(self._proc, self.exclude_pids | multiprocessing_helper_pids())
        self.peak_bytes = max(self.peak_bytes, rss)
        self.samples += 1
        return rss

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> PeakRSSSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.peak_bytes

    def __enter__(self) -> PeakRSSSampler:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
