"""Evaluation and learning-rate schedule shared by every trainer (single-process, SCAPE, RGC)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from lmrepro.data.batches import eval_batches
from lmrepro.model import lm_loss


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
    return losses


def bits_per_byte(losses_nats: list[float]) -> float:
    """Mean loss over equally sized batches, in bits per byte."""
    return float(np.mean(losses_nats)) / math.log(2)
