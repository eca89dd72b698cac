"""Single-process executors: synchronous RGC (stages in turn) and, sharing the loop, global
backprop (docs/rgc.md).

Both run in this process with ``config.single_process_threads`` intra-op threads (the same total
core budget as the async executor), sample each step's batch from the seeded generator, split it
into micro-batches, accumulate gradients (each micro-batch loss scaled by ``1/micro_batches``) and
take one optimizer step per step. Checkpoints hold everything the next step depends on (weights,
AdamW states, generator state), so a resumed run is bit-identical to an uninterrupted one on CPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from lmrepro.data.batches import sample_batch
from lmrepro.evaluation import bits_per_byte
from lmrepro.memory import MemorySampler
from lmrepro.optim.comm import grads_to_flat
from lmrepro.results import holds_writer_lock
from lmrepro.rgc.common import (Clock, ConsensusQueue, Recorder, TrainResult, batch_generator,
                                build_model, evaluate, load_state, lr_at, make_adamw,
                                make_summary, micro_batches, run_identity, save_state, set_lr)
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.stages import (accumulate_backprop_grads, accumulate_rgc_grads, decoder_parameters,
                                stage_bounds, stage_parameters)


def make_optimizers(model: torch.nn.Module, cfg: RGCConfig, executor: str
                    ) -> dict[str, torch.optim.Optimizer]:
    """RGC: one AdamW per stage (``stage0`` .. , stage 0 with the embedding) and one for the
    decoder (fed the consensus gradient). Backprop: one AdamW over every parameter (``all``)."""
    if executor == "backprop":
        return {"all": make_adamw(model, model.parameters(), cfg)}
    bounds = stage_bounds(cfg.n_layers, cfg.n_stages)
    opts = {f"stage{k}": make_adamw(model, stage_parameters(model, bounds, k), cfg)
            for k in range(cfg.n_stages)}
    opts["decoder"] = make_adamw(model, decoder_parameters(model), cfg)
    return opts


@holds_writer_lock("out_dir")     # one writer per run directory (docs/reliability.md)
def train_single_process(cfg: RGCConfig, executor: str, train_data: np.ndarray,
                         val_data: np.ndarray, out_dir: Path | None = None,
                         corpus: str = "synthetic", name: str | None = None,
                         stop_after: int | None = None, seed: int = 0) -> TrainResult:
    """Run the ``sync`` or ``backprop`` executor; see :func:`lmrepro.rgc.train`."""
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.single_process_threads)
    try:
        return _run(cfg, executor, train_data, val_data, out_dir, corpus, name, stop_after, seed)
    finally:
        torch.set_num_threads(prev_threads)


def _run(cfg: RGCConfig, executor: str, train_data: np.ndarray, val_data: np.ndarray,
         out_dir: Path | None, corpus: str, name: str | None, stop_after: int | None, seed: int
         ) -> TrainResult:
    sampler = MemorySampler().start()
    model = build_model(cfg, seed)
    model.train()
    bounds = stage_bounds(cfg.n_layers, cfg.n_stages)
    opts = make_optimizers(model, cfg, executor)
    gen = batch_generator(seed)
    identity = run_identity(cfg, executor, seed)
    start = 0
    pending: list[torch.Tensor] = []
    ck = load_state(out_dir, identity)
    if ck is not None:
        model.load_state_dict(ck["model"])
        for key, opt in opts.items():
            opt.load_state_dict(ck["optims"][key])
        gen.set_state(ck["gen_state"])
        pending = list(ck.get("pending_consensus", []))
        start = int(ck["step"])
        del ck
    dec = decoder_parameters(model)
    consensus = ConsensusQueue(dec, cfg.consensus_staleness, pending)
    rec = Recorder(out_dir, start)
    end = cfg.steps if stop_after is None else max(start, min(cfg.steps, stop_after))
    clock = Clock()
    scale = 1.0 / cfg.micro_batches
    for step in range(start, end):
        clock.start()
        t0 = time.perf_counter()
        lr = lr_at(cfg, step)
        set_lr(opts.values(), lr)
        for opt in opts.values():
            opt.zero_grad(set_to_none=True)
        x, y = sample_batch(train_data, cfg.batch_size, cfg.context, gen)
        per_micro: list[list[float]] = []
        for xm, ym in micro_batches(x, y, cfg.micro_batches):
            if executor == "backprop":
                per_micro.append([accumulate_backprop_grads(model, xm, ym, scale)])
            else:
                per_micro.append(accumulate_rgc_grads(model, bounds, xm, ym, cfg.horizon, scale))
        if executor == "backprop":
            opts["all"].step()
        else:
            # the decoder's gradient is the consensus (the mean of the readout gradients), applied
            # consensus_staleness steps late (0: now), exactly as the async executor does
            consensus.push(grads_to_flat(dec, torch.empty(sum(p.numel() for p in dec))))
            for k in range(cfg.n_stages):
                opts[f"stage{k}"].step()
            if consensus.pop_into_grads():
                opts["decoder"].step()
        dt = time.perf_counter() - t0
        clock.pause()
        stage_losses = [float(v) for v in np.mean(np.array(per_micro), axis=0)]
        rec.log({"step": step, "loss": stage_losses[-1], "stage_losses": stage_losses, "lr": lr,
                 "step_time_s": dt})
        done = step + 1
        if out_dir is not None and cfg.checkpoint_every and (
                done % cfg.checkpoint_every == 0 or done == cfg.steps):
            save_state(out_dir, identity, done, model.state_dict(),
                       {k: o.state_dict() for k, o in opts.items()}, gen.get_state(),
                       consensus.state())
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            rec.log({"step": step, "eval_bpb": bits_per_byte(evaluate(model, val_data, cfg))})
    final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if end < cfg.steps:  # stopped early on purpose: the checkpoint is the product
        n_tokens = (end - start) * cfg.batch_size * cfg.context
        tokens_per_s = n_tokens / clock.total if clock.total > 0 else 0.0
        return TrainResult(executor, tokens_per_s, sampler.stop().rss, float("nan"), [], {},
                           rec.records, final_state, out_dir)
    eval_losses = evaluate(model, val_data, cfg)
    peak = sampler.stop()
    summary = rec.finish(cfg, make_summary(cfg, executor, name, corpus, seed, eval_losses, peak,
                                           model.num_parameters(), rec.records, start,
                                           clock.total, sampler.max_processes), eval_losses)
    return TrainResult(executor, summary["tokens_per_s"], peak.rss, summary["final_bpb"],
                       eval_losses, summary, rec.records, final_state, out_dir)
