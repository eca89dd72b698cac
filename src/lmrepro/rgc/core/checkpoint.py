"""An RGC run's checkpoint: the identity a resuming run must share (:func:`run_identity`) and
its state (:func:`checkpoint_state`), written by the run's checkpoint manager
(:mod:`lmrepro.checkpoints`) in the single-model layout of
:func:`lmrepro.checkpoints.single_model_state` (a full ``ByteTransformer`` state dict, the
optimizer states by name, the batch generator's state) with the RGC executors' pending
gradients; a state as bytes for the async workers' messages."""

from __future__ import annotations

import io as _io
from typing import Any

import torch

from lmrepro.checkpoints import single_model_state
from lmrepro.rgc.config import RGCConfig


def run_identity(cfg: RGCConfig, executor: str, seed: int) -> dict:
    """What a checkpoint must share with the run that resumes it: every setting but the eval
    cadence, the checkpoint cadence and the timeout."""
    free = ("eval_every", "checkpoint_every", "timeout_s")
    d = {k: v for k, v in cfg.to_dict().items() if k in RGCConfig.model_fields and k not in free}
    d["stages_per_worker"] = [len(g) for g in cfg.placement]
    d["threads"] = list(cfg.worker_threads)
    d["executor"] = executor
    d["seed"] = seed
    return d


def checkpoint_state(model_state: dict[str, torch.Tensor], optim_states: dict[str, dict],
                     gen_state: torch.Tensor, pending_consensus: list[torch.Tensor],
                     in_flight: dict[str, Any] | None = None) -> dict[str, Any]:
    """One checkpoint's state, the same for both RGC executors: the package's single-model layout
    (:func:`lmrepro.checkpoints.single_model_state`: weights, optimizer states by name ``stage<k>``
    and ``decoder``, the batch generator) with the consensus gradients not yet applied
    (``consensus_staleness`` > 0) and, for a run whose workers run ahead
    (:attr:`RGCConfig.runs_ahead`), the stage gradients still in flight: the sync executor's
    delayed gradients (``stage_grads``), the async workers' kept steps and unread messages
    (``workers``, by worker)."""
    return single_model_state(model_state, optim_states, gen_state,
                              pending_consensus=list(pending_consensus),
                              in_flight=in_flight or {})


def state_to_bytes(obj: Any) -> bytes:
    buf = _io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> Any:
    return torch.load(_io.BytesIO(data), map_location="cpu", weights_only=True)
