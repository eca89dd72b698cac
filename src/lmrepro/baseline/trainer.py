"""The single-process global-backprop baseline every method is compared with: its setup and
summary around the shared trainer (:func:`lmrepro.backprop.train_backprop`).

AdamW (decoupled weight decay, Loshchilov & Hutter 2019) in torch's ``optimizer_impl`` kernels,
linear warm-up then cosine decay, global gradient-norm clipping, one batch per step (no
micro-batches), periodic evaluation in bits per byte on the fixed evaluation batches, and
per-batch evaluation losses of the final model saved for the paired statistics.

Resumable: every ``checkpoint_every`` steps and after the last, the model, the optimizer, the
batch generator's state and the step are written atomically to ``out_dir/checkpoints/``
(:mod:`lmrepro.results`). A run started again with the same arguments continues from there;
``metrics.jsonl`` is cut back to the checkpointed step, so a run killed at any point and resumed
ends with the same parameters and metrics, bit for bit on CPU, as one that was never
interrupted. A run killed after its last checkpoint resumes with nothing left to train and still
writes a complete summary: its throughput from the training time and its peak memory from the
checkpoint. One writer per run directory (:func:`lmrepro.runlock.writer_lock`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import numpy as np
import torch

from lmrepro.backprop import BackpropSpec, train_backprop
from lmrepro.baseline.config import BaselineConfig
from lmrepro.baseline.roles import BaselineMethod
from lmrepro.data.batches import check_context
from lmrepro.evaluation import bits_per_byte, evaluate_losses
from lmrepro.harness import Cadence, Run, Schedule
from lmrepro.memory import memory_fields
from lmrepro.model import ByteTransformer, ModelConfig
from lmrepro.optim import weight_decay_groups
from lmrepro.seeds import batches_same_seed, seed_init

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
    return cast(torch.nn.Module, torch.compile(model)) if s.compile else model


def run_identity(model_cfg: ModelConfig, settings: BaselineConfig, seed: int, name: str,
                 corpus: str, n_train: int, n_val: int) -> dict:
    """What a checkpoint must share with the run that resumes it."""
    return {"model": model_cfg.to_dict(), "settings": settings.to_dict(), "seed": seed,
            "name": name, "corpus": corpus, "data_bytes": [n_train, n_val]}


def train_single(model_cfg: ModelConfig, settings: BaselineConfig, train_data: np.ndarray,
                 val_data: np.ndarray, out_dir: str | Path, *, seed: int = 0, corpus: str = "",
                 name: str = "backprop", progress: bool = True) -> dict:
    """Train one model with global backprop (:func:`lmrepro.backprop.train_backprop`); write the
    run directory; return its summary."""
    check_context(len(train_data), model_cfg.context, "model.context")
    check_context(len(val_data), model_cfg.context, "model.context")
    s = settings
    seed_init(seed)
    model = ByteTransformer(model_cfg)
    run = Run(out_dir, run_identity(model_cfg, s, seed, name, corpus, len(train_data),
                                    len(val_data)),
              Schedule.of(s, s.lr),
              Cadence(s.steps, s.checkpoint_every, checkpoint_last=True, eval_every=s.eval_every,
                      log_every=s.log_every), s.batch_size * model_cfg.context)

    def evaluate() -> list[float]:
        model.eval()
        losses = evaluate_losses(model, val_data, model_cfg.context, s.eval_batch_size,
                                 s.eval_batches)
        model.train()
        return losses

    def finish(run: Run, end: int) -> dict:
        """The final evaluation, its record and the baseline's summary."""
        losses = evaluate()
        model.eval()
        final_bpb = bits_per_byte(losses)
        # logged at step `steps` (after the last checkpoint): a resume from that checkpoint drops it
        run.log({"step": s.steps, "eval_bpb": final_bpb})
        summary = run.finish(run.summary({
            "name": name, "method": BaselineMethod.BACKPROP, "corpus": corpus, "seed": seed,
            "final_bpb": final_bpb, **memory_fields(run.peak()),
            "n_params": model.num_parameters(), "processes": 1, "threads": s.threads,
            "details": {"executor": "backprop"},     # BackpropDetails
            "config": {"model": model_cfg.to_dict(), "settings": s.to_dict()}}),
            losses, s.eval_batch_size, model_cfg.context)
        log.info("%s done: final %.4f bits/byte, %.0f tokens/s -> %s", name, final_bpb,
                 summary["tokens_per_s"], out_dir)
        return summary

    # the baseline's choices: its AdamW kernels, the batch generator seeded with the run's seed,
    # one batch per step, clipping, optional torch.compile
    return train_backprop(run, BackpropSpec(
        model=model, optimizer=make_optimizer(model, s),
        generator=batches_same_seed(seed), data=train_data,
        batch_size=s.batch_size, context=model_cfg.context, evaluate=evaluate, finish=finish,
        max_grad_norm=s.max_grad_norm, forward=compiled_forward(model, s), threads=s.threads,
        progress=f"train {name}" if progress else None))
