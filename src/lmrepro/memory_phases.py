"""A :class:`~lmrepro.memory.MemorySampler` that keeps a peak per phase of the run.

A run's process tree holds more than the run's training: a copy of the model to evaluate, the
state handed over at the end, the final evaluation. :class:`PhasedSampler` labels every sample
with the phase the run is in (:meth:`PhasedSampler.set_phase`, :meth:`PhasedSampler.phase`)
and keeps the peak of each phase (:attr:`PhasedSampler.phase_peaks`) beside the overall
``peak``, so a run can attribute to itself the phases it names and report the others as their
own rows (the RGC executors: :data:`TRAINING` only, docs/rgc.md "Memory").

A sample is counted in the phase current when it is recorded; a switch takes one full sample
to close the phase before (the memory as it stands belongs to it) and one to open the next.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from lmrepro.memory import Memory, MemorySampler

#: the phases the RGC executors name: the steps (the only one a run's peak is taken from), the
#: start before them (async: the parent's model and the start states it hands the workers), the
#: evaluations between steps, and the end (the final state handed over and cloned, the final
#: evaluation)
START, TRAINING, EVALUATION, END = "start-up", "training", "evaluation", "end of run"
PHASES = (START, TRAINING, EVALUATION, END)


class PhasedSampler(MemorySampler):
    """:class:`MemorySampler` with a peak per phase; ``initial_phase`` is the first."""

    def __init__(self, initial_phase: str = TRAINING, **kwargs: Any) -> None:
        self.phase_name = initial_phase
        self.phase_peaks: dict[str, Memory] = {}
        super().__init__(**kwargs)

    def _note(self, mem: Memory) -> None:
        super()._note(mem)
        self.phase_peaks[self.phase_name] = self.phase_peaks.get(
            self.phase_name, Memory()).peak(mem)

    def set_phase(self, name: str) -> None:
        """Count the samples from now on in phase ``name``."""
        if name == self.phase_name:
            return
        self.sample()
        with self._lock:
            self.phase_name = name
        self.sample()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Phase ``name`` for the ``with`` block, then the phase before."""
        before = self.phase_name
        self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(before)

    def phase_peak(self, *names: str) -> Memory | None:
        """The largest of each kind over the phases ``names`` (None: none was sampled)."""
        got = [self.phase_peaks[n] for n in names if n in self.phase_peaks]
        out: Memory | None = None
        for m in got:
            out = m if out is None else out.peak(m)
        return out

    def phases(self) -> dict[str, dict[str, int]]:
        """Every sampled phase's peak (RSS, PSS, USS bytes), for a run summary's details."""
        with self._lock:
            return {name: m.to_dict() for name, m in self.phase_peaks.items()}
