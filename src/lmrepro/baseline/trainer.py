"""Single-process training with global backprop: the baseline every method is compared with.

AdamW (decoupled weight decay, Loshchilov & Hutter 2019), linear warm-up then cosine decay, global
gradient-norm clipping, periodic evaluation in bits per byte on the fixed evaluation batches, and
per-batch evaluation losses of the final model saved for the paired statistics.

Resumable: every ``checkpoint_every`` steps the model, the optimizer, the batch generator's state
and the step are written atomically to ``out_dir/checkpoints/`` (:mod:`lmrepro.results`). A run
started again with the same arguments continues from there; ``metrics.jsonl`` is cut back to the
checkpointed step, so a run killed at any point and resumed ends with the same parameters and
metrics, bit for bit on CPU, as one that was never interrupted. A run killed after its last
checkpoint resumes with nothing left to train and still writes a complete summary: its throughput
from the training time and its peak memory from the checkpoint. One writer per run directory
(:func:`lmrepro.results.writer_lock`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from lmrepro.baseline.config import BaselineConfig
from lmrepro.baseline.roles import BaselineMethod
from lmrepro.data.batches import check_context, sample_batch
from lmrepro.evaluation import bits_per_byte, cosine_lr, evaluate_losses
from lmrepro.io import append_jsonl, read_jsonl
from lmrepro.memory import Memory, MemorySampler, memory_fields
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.optim import weight_decay_groups
from lmrepro.results import (METRICS, RunSummary, checkpoint, holds_writer_lock,
                             load_checkpoint, step_time_std, truncate_metrics, write_eval_losses,
                             write_summary)

log = logging.getLogger(__name__)


def make_optimizer(model: torch.nn.Module, s: BaselineConfig) -> torch.optim.AdamW:
    """AdamW with the package's weight-decay groups (:func:`lmrepro.optim.weight_decay_groups`).

    ``s.optimizer_impl`` picks torch's implementation (loop, foreach, fused); the update rule
    is the same, the kernels differ (``bench/bench_cpu.py`` measures them side by side). ``loop``
    (torch's CPU default) and ``foreach`` give bit-identical parameters; ``fused`` (the default,
    measured fastest: its optimizer phase is about 2 ms against 7 ms per step of the default
    model) rounds differently, about 1e-5 apart after 20 steps."""
    groups = weight_decay_groups(model, s.weight_decay)
    impl = s.optimizer_impl
    kw = {"foreach": impl == "foreach"} if impl != "fused" else {"fused": True}
    return torch.optim.AdamW(groups, lr=s.lr, betas=(s.beta1, s.beta2), eps=s.eps, **kw)


def compiled_forward(model: torch.nn.Module, s: BaselineConfig) -> torch.nn.Module:
    """The module used for training forward passes: ``torch.compile(model)`` when
    ``s.compile`` (parameters stay shared with ``model``), else ``model`` itself."""
    return torch.compile(model) if s.compile else model


def train_step(forward: torch.nn.Module, model: torch.nn.Module, opt: torch.optim.Optimizer,
               x: torch.Tensor, y: torch.Tensor, grad_clip: float) -> float:
    """One optimisation step of global backprop; returns the loss (nats). ``forward`` is the
    (possibly compiled) module, ``model`` the plain one whose parameters are clipped."""
    loss = lm_loss(forward(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss.item()


def run_identity(model_cfg: ModelConfig, settings: BaselineConfig, seed: int, name: str,
                 corpus: str, n_train: int, n_val: int) -> dict:
    """What a checkpoint must share with the run that resumes it."""
    return {"model": model_cfg.to_dict(), "settings": settings.to_dict(), "seed": seed,
            "name": name, "corpus": corpus, "data_bytes": [n_train, n_val]}


@holds_writer_lock("out_dir")
def train_single(model_cfg: ModelConfig, settings: BaselineConfig, train_data: np.ndarray,
                 val_data: np.ndarray, out_dir: str | Path, *, seed: int = 0, corpus: str = "",
                 name: str = "backprop", progress: bool = True) -> dict:
    """Train one model with global backprop; write the run directory; return its summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_context(len(train_data), model_cfg.context, "model.context")
    check_context(len(val_data), model_cfg.context, "model.context")
    torch.set_num_threads(settings.threads)
    sampler = MemorySampler().start()

    torch.manual_seed(seed)
    model = ByteTransformer(model_cfg)
    opt = make_optimizer(model, settings)
    forward = compiled_forward(model, settings)
    gen = torch.Generator().manual_seed(seed)
    start, elapsed, trained_peak = 0, 0.0, Memory()
    identity = run_identity(model_cfg, settings, seed, name, corpus, len(train_data),
                            len(val_data))
    ckpt = load_checkpoint(out_dir, identity)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["generator"])
        start, elapsed = int(ckpt["step"]), float(ckpt["elapsed_s"])
        trained_peak = Memory(**ckpt.get("peak_memory", {}))
        log.info("resuming %s from step %d (%s)", name, start, out_dir)
    truncate_metrics(out_dir, start)
    metrics_path = out_dir / METRICS

    log.info("training %s: %d params, %d steps -> %s", name, model.num_parameters(),
             settings.steps, out_dir)
    tokens_per_step = settings.batch_size * model_cfg.context
    bar = tqdm(range(start, settings.steps), initial=start, total=settings.steps,
               desc=f"train {name}", disable=not progress)
    model.train()
    for step in bar:
        t0 = time.perf_counter()
        lr = cosine_lr(step, settings.steps, settings.warmup_steps, settings.lr,
                       settings.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sample_batch(train_data, settings.batch_size, model_cfg.context, gen)
        loss_value = train_step(forward, model, opt, x, y, settings.grad_clip)
        dt = time.perf_counter() - t0
        elapsed += dt
        done = step + 1
        if step % settings.log_every == 0 or done == settings.steps:
            append_jsonl(metrics_path, {"step": step, "loss": loss_value, "lr": lr,
                                        "step_time_s": dt})
            bar.set_postfix(loss=f"{loss_value:.3f}")
        if done % settings.eval_every == 0 and done != settings.steps:
            model.eval()
            bpb = bits_per_byte(evaluate_losses(model, val_data, model_cfg.context,
                                                settings.eval_batch_size, settings.eval_batches))
            model.train()
            append_jsonl(metrics_path, {"step": step, "eval_bpb": bpb})
        if (settings.checkpoint_every and done % settings.checkpoint_every == 0
                or done == settings.steps):
            checkpoint(out_dir, done, {"model": model.state_dict(),
                                       "optimizer": opt.state_dict(),
                                       "generator": gen.get_state(), "elapsed_s": elapsed,
                                       "peak_memory": sampler.peak.peak(trained_peak).to_dict()},
                       identity)

    model.eval()
    losses = evaluate_losses(model, val_data, model_cfg.context, settings.eval_batch_size,
                             settings.eval_batches)
    final_bpb = bits_per_byte(losses)
    # logged at step `steps` (after the last checkpoint): a resume from that checkpoint drops it
    append_jsonl(metrics_path, {"step": settings.steps, "eval_bpb": final_bpb})
    write_eval_losses(out_dir, losses, settings.eval_batch_size, model_cfg.context)
    summary = write_summary(out_dir, RunSummary(
        name=name, method=BaselineMethod.BACKPROP, corpus=corpus, seed=seed, steps=settings.steps,
        tokens=settings.steps * tokens_per_step, final_bpb=final_bpb,
        mean_step_time_s=elapsed / settings.steps,
        tokens_per_s=settings.steps * tokens_per_step / max(elapsed, 1e-12),
        train_time_s=elapsed, step_time_std_s=step_time_std(read_jsonl(metrics_path)),
        **memory_fields(sampler.stop().peak(trained_peak)), n_params=model.num_parameters(),
        processes=1, threads=settings.threads,
        resumed_from_step=start, executor="backprop",
        config={"model": model_cfg.to_dict(), "settings": settings.to_dict()}))
    log.info("%s done: final %.4f bits/byte, %.0f tokens/s -> %s", name, final_bpb,
             summary["tokens_per_s"], out_dir)
    return summary
