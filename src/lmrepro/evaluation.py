"""What every trainer shares (single-process, SCAPE, RGC): the settings of a training run's
schedule, optimizer and evaluation (:class:`TrainingConfig`), the learning-rate schedule and the
fixed evaluation set.

The evaluation set (:func:`eval_window_starts`) is the whole validation split cut into
non-overlapping windows of ``context + 1`` bytes (each window's last byte is the next window's
first input, so every byte of the split but the first is a target exactly once), grouped into
batches of ``eval_batch_size`` windows in order; the at most ``eval_batch_size - 1`` windows that
do not fill a last batch are left out. ``eval_batches: null`` (the default) takes all of them;
``eval_batches: N`` takes N batches of windows evenly spaced over the split, a stated fraction
``N * eval_batch_size * context / split bytes`` of it (:func:`eval_coverage`). The set depends
only on the split and these settings, so every method and every seed is scored on the very same
bytes and the per-batch losses are paired.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from lmrepro.config import Section
from lmrepro.data.batches import check_context, windows
from lmrepro.errors import check
from lmrepro.lifetime import fault_point
from lmrepro.model import lm_loss


class TrainingConfig(Section):
    """The settings every trainer's configuration starts from (declared once, here): steps and
    batch, the warm-up + cosine schedule (:func:`cosine_lr`), the Adam-family hyper-parameters,
    the fixed evaluation set and the checkpoint cadence."""

    steps: int = Field(default=200, ge=1, description="optimizer steps")
    batch_size: int = Field(default=16, ge=1, description="sequences per step (per worker for "
                            "data-parallel runs)")
    lr: float = Field(default=1e-3, gt=0.0, le=1.0, description="peak learning rate")
    warmup_steps: int = Field(default=20, ge=0, description="linear warm-up steps")
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0,
                                description="final lr / peak lr of the decay")
    lr_schedule: Literal["cosine", "wsd"] = Field(
        default="cosine", description="cosine: warm-up, then cosine decay over the whole run; "
        "wsd: warm-up, constant, then a linear decay over the last decay_fraction of the run "
        "(warmup-stable-decay: the lr at a step does not depend on the run's length until the "
        "decay starts)")
    decay_fraction: float = Field(default=0.1, gt=0.0, le=1.0, description="wsd: the final "
                                  "fraction of the run over which the lr decays")
    weight_decay: float = Field(default=0.1, ge=0.0, description="decoupled weight decay "
                                "(matrices only: lmrepro.optim.groups)")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0)
    eval_batches: int | None = Field(default=None, ge=1, description="evaluation batches: "
                                     "null = the whole validation split in non-overlapping "
                                     "windows; N = N batches of windows evenly spaced over it")
    eval_batch_size: int = Field(default=16, ge=1, description="windows per evaluation batch")
    checkpoint_every: int = Field(default=50, ge=0, description="steps between checkpoints; "
                                  "0: no periodic checkpoints")


def cosine_lr(step: int, total_steps: int, warmup_steps: int, base_lr: float,
              min_lr_ratio: float = 0.1) -> float:
    """Linear warm-up to ``base_lr`` over ``warmup_steps``, then cosine decay to
    ``min_lr_ratio * base_lr`` at ``total_steps``. ``step`` counts from 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return base_lr * (min_lr_ratio
                      + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def wsd_lr(step: int, total_steps: int, warmup_steps: int, base_lr: float,
           min_lr_ratio: float = 0.1, decay_fraction: float = 0.1) -> float:
    """Warmup-stable-decay (Hägele et al. 2024, arXiv 2405.18392): linear warm-up to ``base_lr``
    over ``warmup_steps``, constant, then linear decay to ``min_lr_ratio * base_lr`` over the
    last ``round(decay_fraction * total_steps)`` steps. Before the decay starts the lr of a step
    is the same for every run length, so points along a run are not confounded by its end."""
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    decay = max(1, round(decay_fraction * total_steps))
    start = total_steps - decay
    if step < start:
        return base_lr
    progress = min(1.0, (step - start + 1) / decay)
    return base_lr * (1.0 - (1.0 - min_lr_ratio) * progress)


def decay_start(total_steps: int, decay_fraction: float) -> int:
    """The first step of a wsd run's decay (its stable phase is every step before it)."""
    return total_steps - max(1, round(decay_fraction * total_steps))


def eval_windows_available(n_bytes: int, context: int) -> int:
    """Non-overlapping windows of ``context + 1`` bytes (stride ``context``) in ``n_bytes``."""
    check_context(n_bytes, context)
    return (n_bytes - 1) // context


def eval_window_starts(n_bytes: int, context: int, batch_size: int,
                       n_batches: int | None = None) -> np.ndarray:
    """Window starts ``(batches, batch_size)`` of the evaluation set of a split of ``n_bytes``.

    ``n_batches`` None: every full batch of the non-overlapping windows, in order; an int: that
    many batches of windows evenly spaced over the split (refused when the split holds fewer).
    """
    check(isinstance(batch_size, int) and batch_size >= 1, "eval_batch_size", batch_size,
          "must be an integer >= 1")
    available = eval_windows_available(n_bytes, context)
    full = available // batch_size
    check(full >= 1, "eval_batch_size", batch_size,
          f"must be <= the {available} non-overlapping windows of context {context} in the "
          f"validation split ({n_bytes} bytes)")
    if n_batches is None:
        index = np.arange(full * batch_size)
    else:
        check(isinstance(n_batches, int) and 1 <= n_batches <= full, "eval_batches", n_batches,
              f"must be null (the whole split) or an integer in [1, {full}]: the validation "
              f"split holds {full} batches of {batch_size} non-overlapping windows")
        spread = np.linspace(0, available - 1, n_batches * batch_size)
        index = np.floor(spread + 0.5).astype(np.int64)  # round half up: no duplicates
    return (index * context).reshape(-1, batch_size)


def eval_coverage(n_bytes: int, context: int, batch_size: int, n_batches: int | None = None
                  ) -> float:
    """The fraction of the split's target bytes the evaluation set scores (1.0 less the bytes
    of an incomplete last batch when ``n_batches`` is None)."""
    starts = eval_window_starts(n_bytes, context, batch_size, n_batches)
    return starts.size * context / (n_bytes - 1)


@torch.no_grad()
def evaluate_losses(logits_fn: Callable[[torch.Tensor], torch.Tensor], data: np.ndarray,
                    context: int, batch_size: int, n_batches: int | None = None) -> list[float]:
    """Mean next-byte loss (nats) of each batch of the evaluation set (:func:`eval_window_starts`).

    ``logits_fn`` maps inputs ``(B, T)`` to logits ``(B, T, 256)``; for RGC it is the last stage's
    readout. The batches are the same for every method and seed, so the lists are paired.
    """
    losses = []
    for starts in eval_window_starts(len(data), context, batch_size, n_batches):
        x, y = windows(data, starts, context)
        losses.append(float(lm_loss(logits_fn(x), y)))
        fault_point("evaluate")     # test hook (docs/reliability.md): killed mid-evaluation
    return losses


def bits_per_byte(losses_nats: list[float]) -> float:
    """Mean loss over equally sized batches, in bits per byte."""
    return float(np.mean(losses_nats)) / math.log(2)
