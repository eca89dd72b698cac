"""Training and evaluation batches from a uint8 byte array.

Training windows start at uniformly random offsets drawn from a seeded ``torch.Generator`` (so a
run is reproducible and resumable from the generator's state). Evaluation uses a fixed, evenly
spaced set of windows so every method is scored on the very same bytes: the per-batch losses are
paired across methods, as the non-inferiority test needs.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from lmrepro.errors import check


def check_context(n_bytes: int, context: int, name: str = "model.context") -> None:
    """A window needs ``context + 1`` bytes (inputs and the shifted targets)."""
    check(context + 1 <= n_bytes, name, context,
          f"must be < the number of bytes in the split ({n_bytes})")


def windows(data: np.ndarray, starts: np.ndarray | torch.Tensor, context: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``x = data[s:s+T]`` and targets ``y = data[s+1:s+T+1]`` for each start ``s``."""
    starts = np.asarray(starts, dtype=np.int64)
    offsets = starts[:, None] + np.arange(context + 1, dtype=np.int64)[None, :]
    chunk = torch.from_numpy(np.asarray(data[offsets], dtype=np.int64))
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def sample_batch(data: np.ndarray, batch_size: int, context: int, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A random training batch ``(x, y)`` of shape ``(batch_size, context)``, int64."""
    check_context(len(data), context)
    starts = torch.randint(0, len(data) - context, (batch_size,), generator=generator)
    return windows(data, starts.numpy(), context)


def eval_starts(n_bytes: int, context: int, batch_size: int, n_batches: int) -> np.ndarray:
    """Evenly spaced window starts ``(n_batches, batch_size)`` covering the split."""
    check_context(n_bytes, context)
    total = batch_size * n_batches
    return np.linspace(0, n_bytes - context - 1, total).astype(np.int64).reshape(n_batches,
                                                                                   batch_size)


def eval_batches(data: np.ndarray, context: int, batch_size: int, n_batches: int
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed evaluation batches: same bytes for every method and every call."""
    for starts in eval_starts(len(data), context, batch_size, n_batches):
        yield windows(data, starts, context)
