"""The ``backprop`` executor: RGC's comparison, global backprop through the package's one
global-backprop trainer (:func:`lmrepro.backprop.train_backprop`).

What it shares with the RGC executors, so the comparison differs only in the training rule: the
model and its initialisation (:func:`~lmrepro.rgc.core.recipe.build_model`), the batches (the seeded
:func:`~lmrepro.seeds.batches_offset`, ``micro_batches`` parts per step), the AdamW
settings (:func:`~lmrepro.rgc.core.recipe.make_adamw`, here one over every parameter), the
single-process thread budget (``config.single_process_threads``), the evaluation, the run's
identity and cadences (:func:`~lmrepro.rgc.core.run_spec.harness`) and the summary
(:func:`~lmrepro.rgc.core.result.finish`). No clipping, as in the RGC executors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmrepro.backprop import BackpropSpec, train_backprop
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.core.recipe import build_model, evaluate, make_adamw
from lmrepro.rgc.core.result import TrainResult, finish
from lmrepro.rgc.core.run_memory import in_evaluation, run_sampler
from lmrepro.rgc.core.run_spec import RunSpec, harness
from lmrepro.seeds import batches_offset


def train_backprop_executor(cfg: RGCConfig, spec: RunSpec, train_data: np.ndarray,
                            val_data: np.ndarray) -> TrainResult:
    """Run the ``backprop`` executor; see :func:`lmrepro.rgc.train`."""
    model = build_model(cfg, spec.seed)
    sampler = run_sampler()

    def record(loss: float) -> dict[str, Any]:
        # the RGC executors' record: one local loss per stage; global backprop has one readout
        return {"loss": loss, "stage_losses": [loss]}

    return train_backprop(harness(cfg, spec, sampler), BackpropSpec(
        model=model, optimizer=make_adamw(model, model.parameters(), cfg),
        generator=batches_offset(spec.seed), data=train_data, batch_size=cfg.batch_size,
        context=cfg.model.context,
        evaluate=in_evaluation(sampler, lambda: evaluate(model, val_data, cfg)),
        finish=lambda run, end: finish(cfg, spec, run, model, val_data, end),
        micro_batches=cfg.micro_batches, threads=cfg.single_process_threads, record=record,
        stop_after=spec.stop_after))
