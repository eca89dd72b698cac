"""The ``sync`` executor: synchronous RGC, the stages in turn in one process (docs/rgc.md).

It runs with ``config.single_process_threads`` intra-op threads (the same total core budget as
the async executor), samples each step's batch from the seeded generator, splits it into
micro-batches, accumulates every stage's local gradients (each micro-batch loss scaled by
``1/micro_batches``) and takes one step of each stage's optimizer (:func:`_step_fn`). Global
backprop, RGC's comparison, is the package's one global-backprop trainer
(:mod:`lmrepro.rgc.executors.backprop`).

The run around the step (resume, schedule, checkpoints, evaluation, records) is the harness's
(:mod:`lmrepro.harness`). Checkpoints hold
everything the next step depends on (weights, AdamW states, generator state, pending consensus
gradients), so a resumed run is bit-identical to an uninterrupted one on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lmrepro.checkpoints import restore_single_model
from lmrepro.data.batches import sample_batch
from lmrepro.evaluation import bits_per_byte
from lmrepro.harness import StepFn
from lmrepro.model import ByteTransformer
from lmrepro.optim.comm import grads_to_flat
from lmrepro.rgc.core.checkpoint import checkpoint_state
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.executors.consensus_queue import ConsensusQueue
from lmrepro.rgc.executors.gradient_delay import StageGradientDelay
from lmrepro.rgc.core.recipe import build_model, evaluate, make_adamw, micro_batches, set_lr
from lmrepro.rgc.core.result import TrainResult, finish
from lmrepro.rgc.core.run_memory import in_evaluation, run_sampler
from lmrepro.rgc.core.run_spec import RunSpec, harness
from lmrepro.rgc.core.stages import (accumulate_rgc_grads, decoder_parameters, stage_bounds,
                                     stage_parameters)
from lmrepro.seeds import batches_offset


def make_optimizers(model: ByteTransformer, cfg: RGCConfig
                    ) -> dict[str, torch.optim.Optimizer]:
    """One AdamW per stage (``stage0`` .. , stage 0 with the embedding) and one for the decoder
    (fed the consensus gradient)."""
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    opts: dict[str, torch.optim.Optimizer] = {
        f"stage{k}": make_adamw(model, stage_parameters(model, bounds, k), cfg)
        for k in range(cfg.n_stages)}
    opts["decoder"] = make_adamw(model, decoder_parameters(model), cfg)
    return opts


def train_single_process(cfg: RGCConfig, spec: RunSpec, train_data: np.ndarray,
                         val_data: np.ndarray) -> TrainResult:
    """Run the ``sync`` executor; see :func:`lmrepro.rgc.train`."""
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.single_process_threads)
    try:
        return _run(cfg, spec, train_data, val_data)
    finally:
        torch.set_num_threads(prev_threads)


def _run(cfg: RGCConfig, spec: RunSpec, train_data: np.ndarray, val_data: np.ndarray
         ) -> TrainResult:
    model = build_model(cfg, spec.seed)
    model.train()
    opts = make_optimizers(model, cfg)
    gen = batches_offset(spec.seed)
    consensus = ConsensusQueue(decoder_parameters(model), cfg.consensus_staleness)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    delay = StageGradientDelay([stage_parameters(model, bounds, k) for k in range(cfg.n_stages)],
                               cfg.stage_gradient_delays)

    def restore(ck: dict[str, Any]) -> None:
        restore_single_model(ck, model, opts, gen)
        consensus.restore(ck.get("pending_consensus", []))
        delay.restore(ck.get("in_flight", {}).get("stage_grads", {}))

    def state() -> dict[str, Any]:
        return checkpoint_state(model.state_dict(), {k: o.state_dict() for k, o in opts.items()},
                                gen.get_state(), consensus.state(),
                                {"stage_grads": delay.state()} if cfg.runs_ahead else None)

    with harness(cfg, spec, run_sampler()) as run:
        end = spec.end(cfg, run.resume(restore))
        step = _step_fn(cfg, model, opts, consensus, delay, gen, train_data)
        run.train(step, state, in_evaluation(
            run.sampler, lambda: bits_per_byte(evaluate(model, val_data, cfg))), end)
        return finish(cfg, spec, run, model, val_data, end)


def _step_fn(cfg: RGCConfig, model: ByteTransformer,
             opts: dict[str, torch.optim.Optimizer], consensus: ConsensusQueue,
             delay: StageGradientDelay, gen: torch.Generator, train_data: np.ndarray) -> StepFn:
    """One step: the batch in micro-batches, their gradients accumulated (each stage's local
    losses within the horizon, each weighted by ``cfg.loss_weights``), then the updates; the
    decoder takes the consensus gradient (the weighted mean),
    ``consensus_staleness`` steps late (0: now), and a stage whose async worker runs ahead its
    gradient ``stage_gradient_delays[k]`` steps late, as the async executor does. Logs every
    stage's loss; ``loss`` is the last stage's."""
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    dec = consensus.params
    scale = 1.0 / cfg.micro_batches

    def step(i: int, lr: float) -> dict[str, Any]:
        set_lr(opts.values(), lr)
        for opt in opts.values():
            opt.zero_grad(set_to_none=True)
        x, y = sample_batch(train_data, cfg.batch_size, cfg.model.context, gen)
        per_micro: list[list[float]] = []
        for xm, ym in micro_batches(x, y, cfg.micro_batches):
            per_micro.append(accumulate_rgc_grads(model, bounds, xm, ym, cfg.horizon, scale,
                                                  cfg.loss_weights))
        consensus.push(grads_to_flat(dec, torch.empty(sum(p.numel() for p in dec))))
        delay.shift()
        for k in range(cfg.n_stages):
            opts[f"stage{k}"].step()
        if consensus.pop_into_grads():
            opts["decoder"].step()
        stage_losses = [float(v) for v in np.mean(np.array(per_micro), axis=0)]
        return {"loss": stage_losses[-1], "stage_losses": stage_losses}

    return step
