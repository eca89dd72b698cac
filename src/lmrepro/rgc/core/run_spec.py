"""One RGC run: what to run (:class:`RunSpec`) and its harness (:func:`harness`: the identity of
its checkpoints, its schedule and :func:`cadence`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmrepro.harness import Cadence, Run, Schedule
from lmrepro.memory import MemorySampler
from lmrepro.rgc.core.checkpoint import run_identity
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.roles import RGCMethod


@dataclass(frozen=True)
class RunSpec:
    """One run of :func:`lmrepro.rgc.train`: the executor, the seed, its names in the record,
    its run directory (None: nothing written) and where to stop early (``stop_after``)."""

    executor: str
    seed: int = 0
    corpus: str = "synthetic"
    name: str | None = None
    out_dir: Path | None = None
    stop_after: int | None = None
    #: the test split, scored once at the end beside the validation split (None: not scored);
    #: the length study tunes on the validation split and judges on this one
    test_data: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def method(self) -> RGCMethod:
        return (RGCMethod.BACKPROP if self.executor in ("backprop", "pipelined_backprop")
                else RGCMethod.RGC)

    def end(self, cfg: RGCConfig, start: int) -> int:
        """The step this invocation stops before."""
        return cfg.steps if self.stop_after is None else max(start, min(cfg.steps,
                                                                         self.stop_after))


def cadence(cfg: RGCConfig) -> Cadence:
    """Every step logged, a checkpoint every ``checkpoint_every`` steps and after the last (none
    at 0), an evaluation every ``eval_every`` steps before the last."""
    return Cadence(cfg.steps, cfg.checkpoint_every, checkpoint_last=bool(cfg.checkpoint_every),
                   eval_every=cfg.eval_every)


def harness(cfg: RGCConfig, spec: RunSpec, sampler: MemorySampler) -> Run:
    """The run's harness (:func:`cadence`, the identity of :func:`run_identity`)."""
    return Run(spec.out_dir, run_identity(cfg, spec.executor, spec.seed),
               Schedule.of(cfg, cfg.lr), cadence(cfg),
               cfg.batch_size * cfg.model.context, sampler=sampler)
