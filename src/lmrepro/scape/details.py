"""The facts a SCAPE-suite run records beyond the common run record (``RunSummary.details``),
declared for the wing's methods by :mod:`lmrepro.scape.wing`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import model_validator

from lmrepro.results import RunDetails


def sparsity_from_density(data: Any) -> Any:
    """Older records' ``mean_density`` d (the fraction sent) read as ``mean_sparsity`` 1 - d."""
    if isinstance(data, Mapping) and "mean_density" in data:
        d = data["mean_density"]
        data = {k: v for k, v in data.items() if k != "mean_density"}
        data.setdefault("mean_sparsity", None if d is None else 1.0 - d)
    return data


class ScapeDetails(RunDetails):
    """Written by :mod:`lmrepro.scape.train.trainer` (``None``: does not apply to the run's
    method)."""

    sparsity: float | None = None              # the target fraction not sent (dense: 0)
    peak_rss_bytes_per_rank: list[int] | None = None
    device: str | None = None
    backend: str | None = None                 # torch.distributed backend (gloo, nccl)
    batch_size_per_worker: int | None = None
    lr: float | None = None                    # the learning rate the run trained at
    mask_rule: str | None = None               # SCAPE's (ef_momentum, or the stale_m ablation)
    decay_scope: str | None = None             # SCAPE's weight decay: all coordinates or the mask
    topk_inner: str | None = None              # top-k + EF: its inner optimizer
    off_mask_momentum: str | None = None       # sparse methods: m off the mask (zero, decay)
    dense_steps: int | None = None             # sparse methods: dense steps before sparsity
    final_coverage: float | None = None        # sparse methods: coordinates ever selected
    final_coverage_at_target: float | None = None   # the same over the steps at the target
    max_residual_norm: float | None = None     # error-feedback residual, gradient units
    mean_sparsity: float | None = None         # fraction not sent, over the sparse steps

    @model_validator(mode="before")
    @classmethod
    def _older(cls, data: Any) -> Any:
        return sparsity_from_density(data)
