"""What every trainer shares (single-process, SCAPE, RGC): the settings of a training run's
schedule, optimizer and evaluation (:class:`TrainingConfig`), the learning-rate schedule and the
fixed evaluation batches."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from pydantic import Field

from lmrepro.config import Section
from lmrepro.data.batches import eval_batches
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
                                description="final lr / peak lr of the cosine decay")
    weight_decay: float = Field(default=0.1, ge=0.0, description="decoupled weight decay "
                                "(matrices only: lmrepro.optim.groups)")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0)
    eval_batches: int = Field(default=16, ge=1, description="fixed evaluation batches")
    eval_batch_size: int = Field(default=16, ge=1)
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


@torch.no_grad()
def evaluate_losses(logits_fn: Callable[[torch.Tensor], torch.Tensor], data: np.ndarray,
                    context: int, batch_size: int, n_batches: int) -> list[float]:
    """Mean next-byte loss (nats) of each fixed evaluation batch.

    ``logits_fn`` maps inputs ``(B, T)`` to logits ``(B, T, 256)``; for RGC it is the last stage's
    readout. The batches are the same for every method, so the lists are paired.
    """
    losses = []
    for x, y in eval_batches(data, context, batch_size, n_batches):
        losses.append(float(lm_loss(logits_fn(x), y)))
        fault_point("evaluate")     # test hook (docs/reliability.md): killed mid-evaluation
    return losses


def bits_per_byte(losses_nats: list[float]) -> float:
    """Mean loss over equally sized batches, in bits per byte."""
    return float(np.mean(losses_nats)) / math.log(2)
