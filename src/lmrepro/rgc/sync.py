"""Single-process executors: synchronous RGC (stages in turn) and, sharing the loop, global
backprop (docs/rgc.md).

Both run in this process with ``config.single_process_threads`` intra-op threads (the same total
core budget as the async executor), sample each step's batch from the seeded generator, split it
into micro-batches, accumulate gradients (each micro-batch loss scaled by ``1/micro_batches``) and
take one optimizer step per step (:func:`_step_fn`). The run around the step (resume, schedule,
checkpoints, evaluation, records) is the harness's (:mod:`lmrepro.harness`). Checkpoints hold
everything the next step depends on (weights, AdamW states, generator state, pending consensus
gradients), so a resumed run is bit-identical to an uninterrupted one on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lmrepro.data.batches import sample_batch
from lmrepro.evaluation import bits_per_byte
from lmrepro.harness import StepFn
from lmrepro.memory import MemorySampler
from lmrepro.model import ByteTransformer
from lmrepro.optim.comm import grads_to_flat
from lmrepro.rgc.common import (ConsensusQueue, RunSpec, StageGradientDelay, TrainResult,
                                batch_generator, build_model, checkpoint_state, evaluate, finish,
                                harness, make_adamw, micro_batches, set_lr)
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.stages import (accumulate_backprop_grads, accumulate_rgc_grads, decoder_parameters,
                                stage_bounds, stage_parameters)


def make_optimizers(model: ByteTransformer, cfg: RGCConfig, executor: str
                    ) -> dict[str, torch.optim.Optimizer]:
    """RGC: one AdamW per stage (``stage0`` .. , stage 0 with the embedding) and one for the
    decoder (fed the consensus gradient). Backprop: one AdamW over every parameter (``all``)."""
    if executor == "backprop":
        return {"all": make_adamw(model, model.parameters(), cfg)}
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    opts: dict[str, torch.optim.Optimizer] = {
        f"stage{k}": make_adamw(model, stage_parameters(model, bounds, k), cfg)
        for k in range(cfg.n_stages)}
    opts["decoder"] = make_adamw(model, decoder_parameters(model), cfg)
    return opts


def train_single_process(cfg: RGCConfig, spec: RunSpec, train_data: np.ndarray,
                         val_data: np.ndarray) -> TrainResult:
    """Run the ``sync`` or ``backprop`` executor; see :func:`lmrepro.rgc.train`."""
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
    opts = make_optimizers(model, cfg, spec.executor)
    gen = batch_generator(spec.seed)
    consensus = ConsensusQueue(decoder_parameters(model), cfg.consensus_staleness)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    delay = StageGradientDelay([stage_parameters(model, bounds, k) for k in range(cfg.n_stages)],
                               cfg.stage_gradient_delays if spec.executor == "sync"
                               else [0] * cfg.n_stages)

    def restore(ck: dict[str, Any]) -> None:
        model.load_state_dict(ck["model"])
        for key, opt in opts.items():
            opt.load_state_dict(ck["optims"][key])
        gen.set_state(ck["gen_state"])
        consensus.restore(ck.get("pending_consensus", []))
        delay.restore(ck.get("in_flight", {}).get("stage_grads", {}))

    def state() -> dict[str, Any]:
        return checkpoint_state(model.state_dict(), {k: o.state_dict() for k, o in opts.items()},
                                gen.get_state(), consensus.state(),
                                {"stage_grads": delay.state()} if cfg.runs_ahead else None)

    with harness(cfg, spec, MemorySampler()) as run:
        end = spec.end(cfg, run.resume(restore))
        step = _step_fn(cfg, spec.executor, model, opts, consensus, delay, gen, train_data)
        run.train(step, state,
                  lambda: bits_per_byte(evaluate(model, val_data, cfg)), end)
        return finish(cfg, spec, run, model, val_data, end)


def _step_fn(cfg: RGCConfig, executor: str, model: ByteTransformer,
             opts: dict[str, torch.optim.Optimizer], consensus: ConsensusQueue,
             delay: StageGradientDelay, gen: torch.Generator, train_data: np.ndarray) -> StepFn:
    """One step: the batch in micro-batches, their gradients accumulated (global backprop, or
    each stage's local losses within the horizon), then the updates; RGC's decoder takes the
    consensus gradient, ``consensus_staleness`` steps late (0: now), and a stage whose async
    worker runs ahead its gradient ``stage_gradient_delays[k]`` steps late, as the async
    executor does. Logs every stage's loss; ``loss`` is the last stage's."""
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
            if executor == "backprop":
                per_micro.append([accumulate_backprop_grads(model, xm, ym, scale)])
            else:
                per_micro.append(accumulate_rgc_grads(model, bounds, xm, ym, cfg.horizon, scale))
        if executor == "backprop":
            opts["all"].step()
        else:
            consensus.push(grads_to_flat(dec, torch.empty(sum(p.numel() for p in dec))))
            delay.shift()
            for k in range(cfg.n_stages):
                opts[f"stage{k}"].step()
            if consensus.pop_into_grads():
                opts["decoder"].step()
        stage_losses = [float(v) for v in np.mean(np.array(per_micro), axis=0)]
        return {"loss": stage_losses[-1], "stage_losses": stage_losses}

    return step
