"""SCAPE's checkpoint: its state as tensors and plain types, and its restoration
(:meth:`lmrepro.optim.SCAPE.state_dict` and ``load_state_dict``), with the mask in flight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .errors import ParameterError, check

STATE_FORMAT = "lmrepro.SCAPE/2"


@dataclass
class Pending:
    """The next step's mask: either in flight (``work`` to wait for, then decode ``buf``) or
    decoded (``idx``); ``own`` is this rank's part, which needs no decoding."""

    density: float
    buf: torch.Tensor | None = None
    work: Any = None
    own: torch.Tensor | None = None
    idx: torch.Tensor | None = None


def state_of(opt: Any) -> dict[str, Any]:
    """This rank's state: ``m``, its residual, the masks (the in-flight one is waited for),
    coverage bits, the step, and the groups' hyper-parameters. Tensors and plain types only:
    loadable with ``torch.load(weights_only=True)``. The model's parameters are saved with the
    model (replicated)."""
    nxt = None
    if opt._pending is not None:
        nxt = opt._decode(opt._pending).clone()
    return {
        "format": STATE_FORMAT, "step": opt._step, "sparse_steps": opt._sparse_steps,
        "target_steps": opt._target_steps, "ever_at_target": opt.ever_at_target.clone(),
        "rank": opt.comm.rank, "world": opt.comm.world,
        "numels": [s.numel for s in opt.slots], "mask_rule": opt.mask_rule,
        "off_mask_momentum": opt.off_mask_momentum,
        "m": opt.m.clone(), "residual": opt.residual.clone(), "ever": opt.ever.clone(),
        "support": None if opt._support is None else opt._support.clone(),
        "last_in": opt.last_in.clone(),
        "next_mask": nxt,
        "next_density": None if opt._pending is None else opt._pending.density,
        "master": None if opt.master is opt.flat.flat else opt.master.clone(),
        "param_groups": [{k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in g.items() if k not in ("params", "names")}
                         for g in opt.param_groups],
    }


def restore(opt: Any, state: dict[str, Any]) -> None:
    """Restore a state saved by the same rank of an identical set-up (same world size, model,
    groups and rule). Restore the model's parameters separately (before or after)."""
    check(isinstance(state, dict) and state.get("format") == STATE_FORMAT,
          "SCAPE state_dict", state.get("format") if isinstance(state, dict) else
          type(state).__name__, f"must come from SCAPE.state_dict() ({STATE_FORMAT})")
    for key, mine in (("rank", opt.comm.rank), ("world", opt.comm.world),
                      ("numels", [s.numel for s in opt.slots]),
                      ("mask_rule", opt.mask_rule),
                      ("off_mask_momentum", opt.off_mask_momentum)):
        if state.get(key, "zero") != mine:
            raise ParameterError(f"SCAPE state_dict[{key!r}]", state[key],
                                 f"must equal this optimizer's {mine!r} (same world size, "
                                 "model, parameter groups and mask rule)")
    check(len(state["param_groups"]) == len(opt.param_groups), "SCAPE state_dict",
          f"{len(state['param_groups'])} groups", f"must have {len(opt.param_groups)}")
    opt._step = int(state["step"])
    opt._sparse_steps = int(state["sparse_steps"])
    opt._target_steps = int(state["target_steps"])
    opt.ever_at_target.copy_(state["ever_at_target"])
    opt.m.copy_(state["m"])
    opt.residual.copy_(state["residual"])
    opt.ever.copy_(state["ever"])
    if "last_in" in state:      # states saved before the mask diagnostics have none
        opt.last_in.copy_(state["last_in"])
    sup = state["support"]
    opt._support = None if sup is None else sup.to(opt.device)
    nxt = state["next_mask"]
    opt._pending = (None if nxt is None else
                     Pending(density=float(state["next_density"]), idx=nxt.to(opt.device)))
    if state["master"] is not None and opt.master is not opt.flat.flat:
        opt.master.copy_(state["master"])
    for g, saved in zip(opt.param_groups, state["param_groups"]):
        for k, v in saved.items():
            g[k] = tuple(v) if k == "betas" else v
