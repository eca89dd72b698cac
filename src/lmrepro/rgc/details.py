"""The facts an RGC-suite run records beyond the common run record (``RunSummary.details``),
declared for method ``rgc`` by :mod:`lmrepro.rgc.wing`; the suite's backprop runs record the
same (their RGC-only facts ``None``)."""

from __future__ import annotations

from typing import Any

from lmrepro.results import RunDetails


class RGCDetails(RunDetails):
    """Written by :func:`lmrepro.rgc.core.result.summary_fields` and ``finish``."""

    executor: str | None = None                   # async | sync | backprop | pipelined_backprop
    threads_per_process: list[int] | None = None
    placement: list[list[int]] | None = None      # stages of each process
    horizon: int | None = None                    # RGC's local horizon H
    consensus_staleness: int | None = None        # decoder consensus applied s steps late
    stage_gradient_delay: list[int] | None = None  # per stage: its gradients' delay in steps
    cores_declared: int | None = None
    machine_cores: int | None = None
    oversubscribed: bool | None = None            # more threads than the machine's cores
    memory_processes: int | None = None           # processes of the measured tree
    worker_runtimes_memory: dict[str, int] | None = None   # async: the workers' bare runtimes
    memory_exact: dict[str, Any] | None = None    # per-process high-water marks (VmHWM)
    memory_phases: dict[str, dict[str, int]] | None = None   # phase -> peak RSS/PSS/USS
    memory_attributed: str | None = None          # what the summary's peak_*_bytes count
    process_tree: dict[str, Any] | None = None    # root_pid, launcher_pid, fresh
