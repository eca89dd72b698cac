"""What the three RGC executors train and evaluate with, identically: the model and its seeded
initialisation, AdamW with the package's weight-decay rule, the learning rate, the batch
generator and micro-batches, and the evaluation of the last stage's readout."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from lmrepro.evaluation import evaluate_losses
from lmrepro.harness import Schedule
from lmrepro.model import ByteTransformer
from lmrepro.optim.groups import weight_decay_groups
from lmrepro.rgc.config import RGCConfig
from lmrepro.seeds import seed_init


def build_model(cfg: RGCConfig, seed: int) -> ByteTransformer:
    """The model, initialised from ``seed`` (identical in every process and executor)."""
    seed_init(seed)
    return ByteTransformer(cfg.model)


def make_adamw(model: ByteTransformer, params: Iterable[torch.nn.Parameter], cfg: RGCConfig
               ) -> torch.optim.AdamW:
    """AdamW over ``params`` (a part of ``model``) with the package's one weight-decay rule
    (:func:`lmrepro.optim.groups.weight_decay_groups`: matrices decay; 1-D tensors and the
    embeddings do not)."""
    return torch.optim.AdamW(weight_decay_groups(model, cfg.weight_decay, params), lr=cfg.lr,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=False)


def lr_at(cfg: RGCConfig, step: int) -> float:
    return Schedule.of(cfg, cfg.lr)(step)


def set_lr(optimizers: Iterable[torch.optim.Optimizer], lr: float) -> None:
    for opt in optimizers:
        for g in opt.param_groups:
            g["lr"] = lr



def micro_batches(x: torch.Tensor, y: torch.Tensor, n: int
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(x.chunk(n, dim=0), y.chunk(n, dim=0)))


def evaluate(model: ByteTransformer, val: np.ndarray, cfg: RGCConfig) -> list[float]:
    """Per-batch losses (nats) of the last stage's readout ``D(h_K)`` on the fixed eval set.

    The last stage's readout is the model's own forward pass (all blocks, then the decoder)."""
    was = model.training
    model.eval()
    try:
        return evaluate_losses(model, val, cfg.model.context, cfg.eval_batch_size,
                               cfg.eval_batches)
    finally:
        model.train(was)
