"""An RGC run's memory by phase: its sampler, the phase it counts in, the peak that counts
(:data:`ATTRIBUTED`) and the memory facts of its summary's ``details``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lmrepro.harness import Run
from lmrepro.memory import Memory, MemorySampler
from lmrepro.memory_phases import END, EVALUATION, PHASES, START, TRAINING, PhasedSampler


#: what a run's ``peak_*_bytes`` count (``details.memory_attributed``; docs/rgc.md, "Memory")
ATTRIBUTED = (f"the {TRAINING} phase: the peak of the run's process tree while it trained (an "
              "async parent holds no model then). Not counted, each its own row in "
              f"details.memory_phases: {START} (async: the parent's model and the start states "
              f"it hands the workers), {EVALUATION} (evaluations between steps; async: the "
              f"parent's evaluation copy of the model) and {END} (the final state handed over "
              "and cloned, the final evaluation)")

#: whether this process was started for one run only (:func:`mark_fresh_process`)
_FRESH_PROCESS = [False]


def mark_fresh_process() -> None:
    """Record that this process was started to train one run (the suite's fresh process per
    run, :mod:`lmrepro.rgc.executors.isolated`): its summary says so (``details.process_tree``)."""
    _FRESH_PROCESS[0] = True


def process_tree() -> dict[str, Any]:
    """The root of the measured process tree: this process, who started it, and whether it was
    started for this run alone (no earlier run's allocations or torch state in it)."""
    return {"root_pid": os.getpid(), "launcher_pid": os.getppid(),
            "fresh": _FRESH_PROCESS[0]}


def run_sampler(initial_phase: str = TRAINING) -> PhasedSampler:
    """The memory sampler of an RGC run (a peak per phase, :mod:`lmrepro.memory_phases`)."""
    return PhasedSampler(initial_phase=initial_phase)


def set_phase(run: Run, name: str) -> None:
    """Count ``run``'s memory samples from now on in phase ``name`` (where its sampler keeps
    phases)."""
    if isinstance(run.sampler, PhasedSampler):
        run.sampler.set_phase(name)


def in_evaluation(sampler: MemorySampler, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run in the sampler's evaluation phase (its memory its own row)."""
    def run() -> Any:
        if not isinstance(sampler, PhasedSampler):
            return fn()
        with sampler.phase(EVALUATION):
            return fn()
    return run


def attributed_peak(run: Run) -> Memory:
    """The run's peak as it counts (:data:`ATTRIBUTED`): the training phase's, with the peak of
    the invocations before a resume; the whole tree's where no phase was kept or sampled. Stops
    the sampler."""
    overall = run.peak()
    sampler = run.sampler
    training = (sampler.phase_peak(TRAINING) if isinstance(sampler, PhasedSampler) else None)
    return overall if training is None else training.peak(run.resumed_peak)


def memory_details(run: Run) -> dict[str, Any]:
    """The memory facts of ``details``: the peaks by phase, what the run's peak counts, the
    process tree, the peaks that do not depend on sampling (``memory_exact``)."""
    sampler = run.sampler
    phases = sampler.phases() if isinstance(sampler, PhasedSampler) else {}
    return {"memory_phases": {p: phases[p] for p in PHASES if p in phases},
            "memory_attributed": ATTRIBUTED if phases else "the whole process tree",
            "process_tree": process_tree(), "memory_exact": sampler.exact()}
