"""Shared machinery of the distributed optimizers: byte-counted collectives, parameter groups and
flat buffers, per-tensor top-k, bit packing, gradient clipping, input checks, and the dense
data-parallel wrapper used for the AdamW / AdamS baselines.

Byte accounting (``comm_stats``): every collective goes through :class:`Comm`, which adds
``numel * element_size`` of the tensor *this rank hands in* to a per-step counter under a kind
(``grad_values``: the values of the step's synchronising collective, gradients or corrected
momenta; ``param_values``; ``mask``). For a ring implementation the bytes a rank actually puts on
the wire are ``2(p-1)/p`` of the hand-in for an all-reduce and ``(p-1)`` times it for an
all-gather (see ``docs/scape.md``). With ``torch.distributed`` not initialised (or a world of
one) the collectives are local, and the hand-in is still counted so byte counts describe the
algorithm, not the world size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .errors import NonFiniteGradientError, ParameterError, check
from .local_group import DONE, LocalMember

KINDS = ("grad_values", "param_values", "mask")


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any, async_op: bool) -> Any:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


class Comm:
    """Collectives over ``group`` (or local fall-backs), counting the bytes each rank hands in.
    ``group`` may be a :class:`.local_group.LocalMember`: a worker simulated in this process."""

    def __init__(self, process_group: Any = None) -> None:
        self.group = process_group
        self.member = process_group if isinstance(process_group, LocalMember) else None
        if self.member is not None:
            self.rank, self.world = self.member.rank, self.member.world
        elif _dist_ready():
            self.rank = dist.get_rank(process_group)
            self.world = dist.get_world_size(process_group)
            check(self.rank >= 0, "process_group", process_group,
                  f"this process (global rank {dist.get_rank()}) is not a member of the group")
        else:
            check(process_group is None, "process_group", process_group,
                  "must be None when torch.distributed is not initialised")
            self.rank, self.world = 0, 1
        self.distributed = (self.member is not None or _dist_ready()) and self.world > 1
        self._current = dict.fromkeys(KINDS, 0)
        self._last = dict.fromkeys(KINDS, 0)

    # -- accounting ---------------------------------------------------------------------------
    def begin_step(self) -> None:
        self._current = dict.fromkeys(KINDS, 0)

    def end_step(self) -> None:
        self._last = dict(self._current)

    def stats(self) -> dict[str, int]:
        """Bytes handed in by this rank during the last completed step, by kind, and ``total``."""
        out = dict(self._last)
        out["total"] = sum(self._last[k] for k in KINDS)
        return out

    def _count(self, t: torch.Tensor, kind: str) -> None:
        if kind not in self._current:
            raise KeyError(f"unknown byte kind {kind!r}; known: {KINDS}")
        self._current[kind] += t.numel() * t.element_size()

    # -- counted collectives --------------------------------------------------------------------
    def all_reduce_(self, t: torch.Tensor, kind: str, async_op: bool = False) -> Any:
        """Sum ``t`` over ranks in place; returns the work handle when ``async_op`` (else, and
        when local, ``None``)."""
        self._count(t, kind)
        if not self.distributed:
            return None
        if self.member is not None:
            self.member.all_reduce_(t)
            return DONE if async_op else None
        work = dist.all_reduce(t, group=self.group, async_op=async_op)
        return work if async_op else None

    def all_gather(self, inp: torch.Tensor, kind: str, async_op: bool = False
                   ) -> tuple[torch.Tensor, Any]:
        """Concatenate every rank's ``inp`` (equal sizes) in rank order; returns ``(out, work)``,
        ``work`` being the handle to ``wait()`` on when ``async_op`` (``None`` if local)."""
        self._count(inp, kind)
        if not self.distributed:
            return inp.clone(), None
        if self.member is not None:
            return self.member.all_gather(inp), (DONE if async_op else None)
        out = torch.empty(inp.numel() * self.world, dtype=inp.dtype, device=inp.device)
        work = _all_gather(out, inp.contiguous(), self.group, async_op)
        return out, (work if async_op else None)

    # -- uncounted set-up collectives ----------------------------------------------------------
    def broadcast_(self, t: torch.Tensor, src_rank: int = 0) -> torch.Tensor:
        """Broadcast from group rank ``src_rank`` (set-up only, not counted per step)."""
        if self.distributed and self.member is not None:
            self.member.broadcast_(t, src_rank)
        elif self.distributed:
            src = dist.get_global_rank(self.group, src_rank) if self.group is not None else src_rank
            dist.broadcast(t, src=src, group=self.group)
        return t

    def gather_ints(self, values: list[int], device: torch.device) -> list[list[int]]:
        """Every rank's list of ints (set-up consistency checks, not counted)."""
        t = torch.tensor(values, dtype=torch.int64, device=device)
        if not self.distributed:
            return [values]
        if self.member is not None:
            return self.member.all_gather(t).view(self.world, -1).tolist()
        out = torch.empty(t.numel() * self.world, dtype=torch.int64, device=device)
        _all_gather(out, t, self.group, False)
        return out.view(self.world, -1).tolist()


# ---------------------------------------------------------------------------------------------
# parameters and parameter groups
# ---------------------------------------------------------------------------------------------
def split_named(params: Iterable[Any], prefix: str = "params") -> tuple[list[torch.Tensor],
                                                                         list[str]]:
    """Accept tensors or ``(name, tensor)`` pairs; return tensors and display names."""
    check(not isinstance(params, (torch.Tensor, str, dict)), prefix, type(params).__name__,
          "must be an iterable of tensors, (name, tensor) pairs or parameter-group dicts")
    tensors, names = [], []
    for i, p in enumerate(params):
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            names.append(p[0])
            p = p[1]
        else:
            names.append(f"{prefix}[{i}]")
        check(isinstance(p, torch.Tensor), names[-1], type(p).__name__, "must be a torch.Tensor")
        tensors.append(p)
    return tensors, names


def param_groups(params: Iterable[Any], who: str) -> list[dict[str, Any]]:
    """Normalise ``params`` (tensors, ``(name, tensor)`` pairs, or parameter-group dicts as
    ``torch.optim`` takes them) into groups ``{"params": [tensors], "names": [str], ...}``.

    A group's other keys (``lr``, ``weight_decay``, ...) are kept for the optimizer to check. A
    group without ``params``, an empty group, a non-tensor or a tensor listed twice is refused
    with a message naming it."""
    items: list[Any] = (list(params) if not isinstance(params, (torch.Tensor, dict))
                        else [params])
    check(len(items) > 0, f"{who}.params", [], "must contain at least one tensor or group")
    groups: list[dict[str, Any]] = []
    if not any(isinstance(x, dict) for x in items):
        tensors, names = split_named(items)
        groups.append({"params": tensors, "names": names})
    else:
        for i, g in enumerate(items):
            check(isinstance(g, dict), f"{who}.params[{i}]", type(g).__name__,
                  "must be a dict when any entry is a parameter group (do not mix groups and "
                  "tensors)")
            check("params" in g, f"{who}.params[{i}]", {k: v for k, v in g.items()},
                  "a parameter group must be a dict with a 'params' entry (a list of tensors)")
            tensors, names = split_named(
                [g["params"]] if isinstance(g["params"], torch.Tensor) else g["params"],
                prefix=f"params[{i}].params")
            if "names" in g:
                given = list(g["names"])
                check(len(given) == len(tensors), f"{who}.params[{i}].names", len(given),
                      f"must name each of the group's {len(tensors)} tensors")
                names = [str(n) for n in given]
            check(len(tensors) > 0, f"{who}.params[{i}].params", [],
                  "must contain at least one tensor")
            groups.append({**g, "params": tensors, "names": names})
    seen: dict[int, str] = {}
    for g in groups:
        for p, n in zip(g["params"], g["names"]):
            check(id(p) not in seen, f"{who}.params ({n})", "listed twice",
                  f"each parameter may appear once (first as {seen.get(id(p))})")
            seen[id(p)] = n
    return groups


def params_and_names(optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], list[str]]:
    """An optimizer's parameters in group order, with the names its groups carry under
    ``"names"`` (:func:`lmrepro.optim.groups.weight_decay_groups` sets them), else
    ``params[i]``."""
    params: list[torch.Tensor] = []
    names: list[str] = []
    for g in optimizer.param_groups:
        given = g.get("names") or [f"params[{len(params) + i}]" for i in range(len(g["params"]))]
        params += list(g["params"])
        names += [str(n) for n in given]
    return params, names


def check_params(params: list[torch.Tensor], names: list[str], who: str) -> None:
    """One device, one floating dtype, all requiring grad; clear errors otherwise."""
    check(len(params) > 0, f"{who}.params", [], "must contain at least one tensor")
    dev, dtype = params[0].device, params[0].dtype
    for p, n in zip(params, names):
        check(p.device == dev, f"{who}.params ({n}).device", str(p.device),
              f"all parameters must be on one device (first is {dev}); mixed devices are not "
              "supported: move the model with .to(device) before building the optimizer")
        check(p.dtype == dtype and p.is_floating_point(), f"{who}.params ({n}).dtype",
              str(p.dtype), f"all parameters must share one floating dtype (first is {dtype})")
        check(p.requires_grad, f"{who}.params ({n}).requires_grad", False,
              "must be True: pass only trainable parameters")


def check_grads(params: list[torch.Tensor], names: list[str], who: str) -> None:
    """Every parameter must have a dense gradient on its own device when ``step()`` runs."""
    for p, n in zip(params, names):
        if p.grad is None:
            raise ParameterError(
                f"{who}.params ({n}, shape {tuple(p.shape)}).grad", None,
                "every parameter needs a gradient at step(): call loss.backward() first, and "
                "build the optimizer only from parameters that take part in the loss (the step "
                "is collective: all ranks must communicate the same coordinates)")
        check(not p.grad.is_sparse, f"{who}.params ({n}).grad", "sparse", "must be dense")
        check(p.grad.device == p.device, f"{who}.params ({n}).grad.device", str(p.grad.device),
              f"must be the parameter's device {p.device}")


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, in one pass (``aminmax`` propagates NaN, and an
    infinity is the minimum or the maximum)."""
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def nonfinite_error(who: str, params: Sequence[torch.Tensor], names: Sequence[str],
                    ranks_bad: int, comm: Comm) -> NonFiniteGradientError:
    """The error every rank raises when ``ranks_bad`` ranks handed in a non-finite gradient; the
    ranks that hold one name the first such parameter and its first bad value."""
    for p, n in zip(params, names):
        g = p.grad
        if g is not None and not all_finite(g):
            bad = g.reshape(-1)[~torch.isfinite(g.reshape(-1))][0].item()
            return NonFiniteGradientError(
                f"{who}.params ({n}).grad", bad,
                f"must be finite (rank {comm.rank} of {comm.world}; {ranks_bad} rank(s) of the "
                "group have a non-finite gradient this step; nothing was updated: the loss "
                "diverged: lower the learning rate or raise the warm-up)")
    return NonFiniteGradientError(
        f"{who}: gradients of {ranks_bad} other rank(s)", "non-finite",
        f"must be finite (this is rank {comm.rank} of {comm.world}, whose gradient is finite; "
        "nothing was updated: the loss diverged)")


def grads_to_flat(params: Iterable[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy every ``p.grad`` (zeros where it is None) into ``out`` in order; returns ``out``."""
    off = 0
    for p in params:
        k = p.numel()
        if p.grad is None:
            out[off:off + k].zero_()
        else:
            out[off:off + k].copy_(p.grad.reshape(-1))
        off += k
    return out


def flat_to_grads(flat: torch.Tensor, params: Iterable[torch.Tensor]) -> None:
    """Write consecutive slices of ``flat`` into the parameters' gradients (allocating them)."""
    off = 0
    for p in params:
        k = p.numel()
        if p.grad is None:
            p.grad = flat[off:off + k].view_as(p).clone()
        else:
            p.grad.copy_(flat[off:off + k].view_as(p.grad))
        off += k


class FlatParams:
    """One contiguous buffer holding every parameter; each ``p.data`` becomes a view into it.

    Writing ``flat[idx] = values`` then updates the model in place (as ZeRO / Megatron contiguous
    buffers do). ``load_state_dict`` on the model still works: it copies into the views.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.numels = [p.numel() for p in params]
        self.n = sum(self.numels)
        p0 = params[0]
        self.flat = torch.zeros(self.n, dtype=p0.dtype, device=p0.device)
        off = 0
        with torch.no_grad():
            for p, k in zip(params, self.numels):
                self.flat[off:off + k].copy_(p.detach().reshape(-1))
                p.data = self.flat[off:off + k].view_as(p)
                off += k

    def gather_grads(self, out: torch.Tensor) -> torch.Tensor:
        """Copy the gradients into ``out``."""
        return grads_to_flat(self.params, out)

    def check_still_bound(self, who: str) -> None:
        """Detect a model moved / re-created after the optimizer was built."""
        for i, p in enumerate(self.params):
            if p.data.untyped_storage().data_ptr() != self.flat.untyped_storage().data_ptr():
                raise ParameterError(f"{who}.params[{i}]", "re-allocated",
                                     "parameters were moved or replaced after the optimizer "
                                     "was built (e.g. model.to(device)); build it after")


# ---------------------------------------------------------------------------------------------
# sparsity, top-k, bit packing, clipping
# ---------------------------------------------------------------------------------------------
def check_sparsity(sparsity: Any, name: str) -> None:
    check(isinstance(sparsity, (int, float)) and not isinstance(sparsity, bool)
          and 0.0 <= float(sparsity) < 1.0, name, sparsity,
          "must be a number in [0, 1) (fraction of a tensor's coordinates not sent each step; "
          "0 is dense)")


def keep_count(density: float, numel: int) -> int:
    """Coordinates kept of a tensor of ``numel`` at ``density = 1 - sparsity``:
    ``max(1, ceil(density * numel))``, at most
    ``numel`` (docs/scape.md, step 6). The product is rounded to 6 decimals first so that a density
    written as ``1 - 0.99`` (= 0.010000000000000009) keeps 100 of 10 000, not 101."""
    if density >= 1.0:
        return numel
    return max(1, min(numel, math.ceil(round(density * numel, 6))))


def topk_indices(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64, ascending) of the ``k`` largest entries of a 1-D ``score``.

    On CPU ``numpy.argpartition`` (introselect, linear time), faster than ``torch.topk`` + sort
    at these sizes (measured in ``bench/bench_scape_netns.py``); on other devices ``torch.topk``.
    Among equal scores at the boundary either choice is valid: the owner's choice is what every
    rank receives."""
    n = score.numel()
    if k >= n:
        return torch.arange(n, device=score.device)
    if score.device.type == "cpu":
        a = score.detach().numpy()
        idx = np.argpartition(a, n - k)[n - k:]
        idx.sort()
        return torch.from_numpy(idx.astype(np.int64, copy=False))
    return torch.topk(score, k, sorted=False).indices.sort().values


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """A bool vector as little-endian packed bytes (uint8, ``ceil(n / 8)`` of them)."""
    if bits.device.type == "cpu":
        return torch.from_numpy(np.packbits(bits.numpy(), bitorder="little"))
    n = bits.numel()
    padded = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[:n] = bits.to(torch.uint8)
    weights = 1 << torch.arange(8, device=bits.device, dtype=torch.uint8)
    return (padded.view(-1, 8) * weights).sum(1, dtype=torch.uint8)


def unpacked_indices(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits` as the sorted int64 positions of the set bits among the
    first ``n``."""
    if packed.device.type == "cpu":
        unpacked = np.unpackbits(packed.numpy(), bitorder="little", count=n)
        return torch.from_numpy(np.flatnonzero(unpacked.view(bool)))
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed.unsqueeze(1) >> shifts) & 1
    return bits.reshape(-1)[:n].nonzero().squeeze(1)


def clip_coefficient(norm: float, max_norm: float | None) -> float:
    """``max_norm / (norm + 1e-6)`` when that is below 1, else 1: the coefficient of
    ``torch.nn.utils.clip_grad_norm_`` (and of the SCAPE authors' ``move_clip_grad_to_reducer``)."""
    if max_norm is None:
        return 1.0
    return min(1.0, max_norm / (norm + 1e-6))


def check_max_grad_norm(value: Any, name: str) -> None:
    check(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                            and math.isfinite(value) and value > 0), name, value,
          "must be None (no clipping) or a finite number > 0")


# ---------------------------------------------------------------------------------------------
# dense data parallel (baselines)
# ---------------------------------------------------------------------------------------------
class DenseDP:
    """Dense data parallelism around any ``torch.optim.Optimizer`` (AdamW / AdamS baselines).

    ``loss.backward(); opt.step()``: ``step`` all-reduces the flattened gradient (one collective,
    counted as ``grad_values``), divides by the world size, clips it to ``max_grad_norm`` (global
    norm of the averaged gradient, identical on every rank, the same clipping as SCAPE's and
    top-k's) and lets the inner optimizer step on it; every rank keeps the full optimizer state
    (plain DDP, no sharding), so no parameters are exchanged. A non-finite averaged gradient
    raises :class:`~lmrepro.optim.errors.NonFiniteGradientError` on every rank before the inner
    step. Parameters are broadcast from rank 0 at construction.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, process_group: Any = None,
                 max_grad_norm: float | None = None) -> None:
        check(isinstance(optimizer, torch.optim.Optimizer), "DenseDP.optimizer",
              type(optimizer).__name__, "must be a torch.optim.Optimizer")
        check_max_grad_norm(max_grad_norm, "DenseDP.max_grad_norm")
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.params, self.names = params_and_names(optimizer)
        check_params(self.params, self.names, "DenseDP")
        self.comm = Comm(process_group)
        self.n = sum(p.numel() for p in self.params)
        check_same_size(self.comm, [self.n], self.params[0].device, "DenseDP")
        with torch.no_grad():
            for p in self.params:
                self.comm.broadcast_(p.data)
        self._buf = torch.zeros(self.n, dtype=self.params[0].dtype, device=self.params[0].device)
        self.last_grad_norm: float | None = None

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        check_grads(self.params, self.names, "DenseDP")
        self.comm.begin_step()
        grads_to_flat(self.params, self._buf)
        self.comm.all_reduce_(self._buf, "grad_values")
        self._buf.div_(self.comm.world)
        if not all_finite(self._buf):       # identical on every rank: all raise together
            raise NonFiniteGradientError("DenseDP: averaged gradient", "non-finite",
                                         "must be finite (nothing was updated: the loss "
                                         "diverged)")
        if self.max_grad_norm is not None:
            norm = float(torch.linalg.vector_norm(self._buf, dtype=torch.float64))
            self.last_grad_norm = norm
            coef = clip_coefficient(norm, self.max_grad_norm)
            if coef < 1.0:
                self._buf.mul_(coef)
        flat_to_grads(self._buf, self.params)
        self.optimizer.step()
        self.comm.end_step()

    def comm_stats(self) -> dict[str, int]:
        return self.comm.stats()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


def check_same_size(comm: Comm, values: list[int], device: torch.device, who: str) -> None:
    """All ranks must agree on the flat sizes (same model): else a ParameterError on every rank."""
    got = comm.gather_ints(values, device)
    if any(row != got[0] for row in got):
        raise ParameterError(f"{who}: flattened parameter sizes per rank", got,
                             "must be identical on every rank of the process group (same model, "
                             "same parameter list, same sparsity)")
