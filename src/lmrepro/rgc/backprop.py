"""Global backprop baseline (DESIGN.md, "RGC, reference design": same model and data at the
same total core budget). The model's own loss ``CE(D(h_L), y)`` is backpropagated through every
block; one AdamW over all parameters. The loop is shared with the sync executor
(:func:`lmrepro.rgc.sync.train_single_process`), so data, schedule, checkpoints and measurement
are identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmrepro.rgc.common import TrainResult
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.stages import accumulate_backprop_grads
from lmrepro.rgc.sync import train_single_process

__all__ = ["accumulate_backprop_grads", "train_backprop"]


def train_backprop(cfg: RGCConfig, train_data: np.ndarray, val_data: np.ndarray,
                   out_dir: Path | None = None, corpus: str = "synthetic",
                   name: str | None = None, stop_after: int | None = None) -> TrainResult:
    """Train the baseline with ``cfg.single_process_threads`` threads."""
    return train_single_process(cfg, "backprop", train_data, val_data, out_dir, corpus, name,
                                stop_after)
