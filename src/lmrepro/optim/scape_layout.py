"""What SCAPE (arXiv 2607.01678) decides once, before its first step: the checks of its
arguments, the sparsity schedule, and the flat layout (where each tensor lives in the flat buffer,
which rank chooses its mask, how a mask travels); and two pure pieces of the step on that layout:
the decoupled update of the flat parameters, and the mask diagnostics (which read a step without
changing it). The step itself is in :mod:`.scape`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .adams import check_hyperparameters
from .comm import check_sparsity, check_max_grad_norm, check_params, keep_count, param_groups
from .errors import check

MASK_RULES = ("ef_momentum", "stale_m")
DECAY_SCOPES = ("all", "mask")
#: what the first moment does off the mask: "zero" (SCAPE's rule, the authors': only the
#: coordinates synced this step carry momentum) or "decay" (AdamS with a zero synced gradient
#: there: ``m <- b1 m``, the rule of an optimizer that keeps a dense momentum)
OFF_MASK_MOMENTUM = ("zero", "decay")
#: the window (steps) of the "updated at least once" diagnostic (:func:`recent_fraction`)
RECENT_WINDOW = 100


def density_at(step: int, target: float, dense_steps: int = 0, density_start: float = 1.0,
               warmup_steps: int = 0) -> float:
    """The fraction of coordinates kept at step ``step`` (0-based; ``1 - sparsity_at``): 1 for
    the first ``dense_steps`` steps, then linear from ``density_start`` to ``target`` over
    ``warmup_steps`` steps, then ``target``. The optimizers' internal form of
    :func:`sparsity_at`, computed from ``1 - sparsity`` as the runs always did.

    Linear as the authors' stored run logs show (their GPT-345M log drops the density by
    0.9/10 000 per step from 1); their stored code is geometric,
    ``s (T/s)^(tau/W)`` (docs/scape.md)."""
    if step < dense_steps:
        return 1.0
    tau = step - dense_steps
    if warmup_steps > 0 and tau < warmup_steps:
        return density_start + (target - density_start) * tau / warmup_steps
    return target


def sparsity_at(step: int, sparsity: float, dense_steps: int = 0, sparsity_start: float = 0.0,
                warmup_steps: int = 0) -> float:
    """The scheduled sparsity of step ``step`` (0-based): 0 (dense) for the first
    ``dense_steps`` steps, then linear from ``sparsity_start`` to ``sparsity`` over
    ``warmup_steps`` steps, then ``sparsity``."""
    return 1.0 - density_at(step, 1.0 - sparsity, dense_steps, 1.0 - sparsity_start,
                            warmup_steps)


def assign_owners(numels: list[int], world: int) -> list[int]:
    """Owner rank of each tensor: contiguous in order and balanced by numel, as the authors'
    reducer assigns them (the current owner takes the next tensor; it hands over once it holds
    ``>= total / world`` coordinates and more tensors than owners remain, or as soon as only as
    many tensors as owners remain)."""
    total = sum(numels)
    owners: list[int] = []
    owner, count = 0, 0
    for i, k in enumerate(numels):
        owners.append(owner)
        count += k
        left_tensors, left_owners = len(numels) - i - 1, world - owner - 1
        if left_owners > 0 and ((count >= total / world and left_tensors > left_owners)
                                or left_tensors <= left_owners):
            owner, count = owner + 1, 0
    return owners


def checked_groups(params: Iterable[Any], lr: float, betas: tuple[float, float], eps: float,
                   weight_decay: float, sparsity: float, dense_steps: int,
                   sparsity_start: float, sparsity_warmup_steps: int, flags: dict[str, Any],
                   max_grad_norm: float | None, mask_rule: str, decay_scope: str,
                   off_mask_momentum: str = "zero") -> list[dict[str, Any]]:
    """Every check of SCAPE's constructor, then its parameter groups
    (:func:`.comm.param_groups`); ``flags``: the boolean options by name. Raises
    :class:`~.errors.ParameterError` naming the argument."""
    who = "SCAPE"
    check_hyperparameters(lr, betas, eps, weight_decay, prefix=who)
    check_sparsity(sparsity, f"{who}.sparsity")
    check(isinstance(dense_steps, int) and not isinstance(dense_steps, bool)
          and dense_steps >= 0, f"{who}.dense_steps", dense_steps, "must be an integer >= 0")
    check_sparsity(sparsity_start, f"{who}.sparsity_start")
    check(isinstance(sparsity_warmup_steps, int) and not isinstance(sparsity_warmup_steps, bool)
          and sparsity_warmup_steps >= 0, f"{who}.sparsity_warmup_steps",
          sparsity_warmup_steps, "must be an integer >= 0")
    for name, flag in flags.items():
        check(isinstance(flag, bool), f"{who}.{name}", flag, "must be True or False")
    check_max_grad_norm(max_grad_norm, f"{who}.max_grad_norm")
    check(mask_rule in MASK_RULES, f"{who}.mask_rule", mask_rule,
          f"must be one of {MASK_RULES}")
    check(decay_scope in DECAY_SCOPES, f"{who}.decay_scope", decay_scope,
          f"must be one of {DECAY_SCOPES}")
    check(off_mask_momentum in OFF_MASK_MOMENTUM, f"{who}.off_mask_momentum", off_mask_momentum,
          f"must be one of {OFF_MASK_MOMENTUM}")
    if off_mask_momentum == "decay":
        check(mask_rule == "ef_momentum" and decay_scope == "all", f"{who}.off_mask_momentum",
              off_mask_momentum, "'decay' needs mask_rule='ef_momentum' and decay_scope='all' "
              f"(got {mask_rule!r}, {decay_scope!r})")
    groups = param_groups(params, who)
    for i, g in enumerate(groups):
        check_params(g["params"], g["names"], who)
        glr, gwd = g.get("lr", lr), g.get("weight_decay", weight_decay)
        check_hyperparameters(glr, betas, eps, gwd, prefix=f"{who}.params[{i}]")
        for key, default in (("betas", tuple(betas)), ("eps", eps)):
            if key in g:
                check(tuple(g[key]) == default if key == "betas" else g[key] == default,
                      f"{who}.params[{i}].{key}", g[key],
                      f"must equal the optimizer's {default!r} (only lr and weight_decay may "
                      "differ per group)")
        extra = set(g) - {"params", "names", "lr", "weight_decay", "betas", "eps"}
        check(not extra, f"{who}.params[{i}]", sorted(extra),
              "unknown parameter-group keys (allowed: params, names, lr, weight_decay)")
    return groups


@dataclass(frozen=True)
class Slot:
    """Where one parameter tensor lives in the flat buffer and who chooses its mask."""

    name: str
    offset: int
    numel: int
    group: int
    excluded: bool          # sent whole every step (1-D with exclude_1d_from_topk)
    owner: int              # rank choosing its mask (-1 if excluded)


@dataclass(frozen=True)
class Layout:
    """The flat buffer's layout: group-major order, owners over the top-k tensors only."""

    slots: list[Slot]
    group_bounds: list[tuple[int, int]]   # [lo, hi) of each parameter group
    spans: list[tuple[int, int]]          # [lo, hi) of each rank's owned tensors ((0, 0): none)
    excluded_idx: torch.Tensor            # global indices of the tensors sent whole, ascending
    world: int

    @property
    def n_excluded(self) -> int:
        return sum(s.numel for s in self.slots if s.excluded)

    def owned_by(self, rank: int) -> list[Slot]:
        return [s for s in self.slots if s.owner == rank]

    def kept(self, density: float) -> list[int]:
        """Coordinates selected per owner rank at ``density`` (excluded tensors not counted)."""
        out = [0] * self.world
        for s in self.slots:
            if s.owner >= 0:
                out[s.owner] += keep_count(density, s.numel)
        return out

    def mask_encoding(self, density: float) -> tuple[str, int]:
        """``("index", int32 entries)`` or ``("bitmap", bytes)`` per rank, whichever hands in
        fewer bytes (the largest rank's size: the all-gather pads to it)."""
        idx_bytes = 4 * max(self.kept(density))
        bit_bytes = max(-(-(hi - lo) // 8) for lo, hi in self.spans)
        if idx_bytes <= bit_bytes:
            return "index", max(self.kept(density))
        return "bitmap", bit_bytes


def excluded_indices(slots: Iterable[tuple[int, int, bool]], device: torch.device
                     ) -> torch.Tensor:
    """Flat indices, ascending, of the tensors sent whole: ``slots`` are ``(offset, numel,
    excluded)`` in buffer order (shared with :mod:`lmrepro.optim.topk`)."""
    parts = [torch.arange(o, o + k, device=device) for o, k, ex in slots if ex]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


def build_layout(param_groups: list[dict[str, Any]], exclude_1d: bool, world: int,
                 device: torch.device) -> Layout:
    """The :class:`Layout` of ``param_groups`` over ``world`` ranks (the same on every rank)."""
    raw, off = [], 0
    for gi, g in enumerate(param_groups):
        for p, name in zip(g["params"], g["names"]):
            raw.append((name, off, p.numel(), gi, exclude_1d and p.dim() <= 1))
            off += p.numel()
    owners = iter(assign_owners([r[2] for r in raw if not r[4]], world))
    slots = [Slot(n, o, k, gi, ex, -1 if ex else next(owners)) for n, o, k, gi, ex in raw]
    bounds, off = [], 0
    for g in param_groups:
        size = sum(p.numel() for p in g["params"])
        bounds.append((off, off + size))
        off += size
    excluded_idx = excluded_indices(((s.offset, s.numel, s.excluded) for s in slots), device)
    spans = []
    for j in range(world):
        mine = [s for s in slots if s.owner == j]
        spans.append((mine[0].offset, mine[-1].offset + mine[-1].numel) if mine else (0, 0))
    return Layout(slots, bounds, spans, excluded_idx, world)


def off_mask_direction(m_prev: torch.Tensor, b1: float, b2: float, eps: float, bc1: float,
                       bc2: float) -> torch.Tensor:
    """AdamS's normalised step where no gradient arrived (``g = 0``): ``m_t = b1 m_prev`` and
    ``v_t = b2 m_prev^2``, so ``u = m_t bc1 / (sqrt(v_t) bc2 + eps)``, about ``b1 / sqrt(b2)``
    times ``sign(m_prev)`` for as long as ``|m_prev|`` is well above ``eps``: a coordinate
    that left the mask keeps moving at nearly full size while its momentum decays."""
    m = m_prev * b1
    return (m * bc1) / (m_prev.abs() * (b2 ** 0.5 * bc2) + eps)


def recent_fraction(last_in: torch.Tensor, t: int, n_excluded: int,
                    window: int = RECENT_WINDOW) -> float:
    """Fraction of the top-k tensors' coordinates in the mask at least once in the ``window``
    steps up to step ``t`` (``last_in``: the last step each coordinate was in it, -1: never;
    the tensors sent whole always count as in, and are left out)."""
    eligible = last_in.numel() - n_excluded
    if eligible <= 0:
        return 0.0
    return (int(((last_in > t - window) & (last_in >= 0)).sum()) - n_excluded) / eligible


def off_mask_mass(u_abs: torch.Tensor, on_mask: torch.Tensor) -> float | None:
    """The share of the step's size ``sum |u|`` that falls on coordinates off the mask
    (``on_mask``: a bool per coordinate); None for a step that moves nothing."""
    total = float(u_abs.sum(dtype=torch.float64))
    if total == 0.0:
        return None
    return float(u_abs[~on_mask].sum(dtype=torch.float64)) / total


def mask_diagnostics(idx: torch.Tensor, u: torch.Tensor, t: int, last_in: torch.Tensor,
                     n_excluded: int) -> dict[str, float | None]:
    """How the mask of step ``t`` relates to the previous one, over the top-k tensors only:
    the fraction of its coordinates kept from step ``t - 1``, and for those that (re-)enter
    it, how many steps they were out and the size of their normalised step ``|u|`` (the step
    is ``lr |u|``) beside that of the coordinates that stayed. ``last_in`` (the last step each
    coordinate was in the mask, -1: never) is brought up to step ``t``; nothing else changes."""
    n_top = idx.numel() - n_excluded            # idx: the owners' parts, then the excluded
    top, ut = idx[:n_top], u[:n_top].abs()
    last = last_in.index_select(0, top)
    stay = last == t - 1
    enter = ~stay
    back = enter & (last >= 0)
    out: dict[str, float | None] = {"mask_kept": float(stay.float().mean()) if n_top else 0.0,
                                    "mask_new": float((last < 0).float().mean()) if n_top else 0.0}
    out["step_stay"] = float(ut[stay].mean()) if bool(stay.any()) else None
    out["step_enter"] = float(ut[enter].mean()) if bool(enter.any()) else None
    out["reentry_gap"] = float((t - last[back]).float().mean()) if bool(back.any()) else None
    last_in.index_fill_(0, top, t)
    if n_excluded:
        last_in.index_fill_(0, idx[n_top:], t)
    return out


def apply_update(p: torch.Tensor, param_groups: list[dict[str, Any]],
                 group_bounds: list[tuple[int, int]], idx: torch.Tensor | None, u: torch.Tensor,
                 decay_scope: str = "all") -> None:
    """``p <- p (1 - lr wd) - lr u`` in place, per group (``u`` on ``idx``, or everywhere when
    ``idx`` is None); with ``decay_scope="mask"`` (an ablation) the decay hits only the
    coordinates of ``idx``."""
    lrs = [float(g["lr"]) for g in param_groups]
    for g, (lo, hi), lr in zip(param_groups, group_bounds, lrs):
        wd = float(g["weight_decay"])
        if lr * wd == 0.0:
            continue
        if decay_scope == "all" or idx is None:
            p[lo:hi].mul_(1.0 - lr * wd)
        else:
            sel = idx[(idx >= lo) & (idx < hi)]
            p.index_copy_(0, sel, p.index_select(0, sel) * (1.0 - lr * wd))
    if idx is None:
        for (lo, hi), lr in zip(group_bounds, lrs):
            p[lo:hi].add_(u[lo:hi], alpha=-lr)
    elif len(set(lrs)) == 1:
        p.index_add_(0, idx, u, alpha=-lrs[0])
    else:
        bounds = torch.tensor([hi for _, hi in group_bounds[:-1]], device=idx.device)
        per = torch.tensor(lrs, dtype=u.dtype, device=u.device)[
            torch.bucketize(idx, bounds, right=True)]
        p.index_add_(0, idx, u * per, alpha=-1.0)
