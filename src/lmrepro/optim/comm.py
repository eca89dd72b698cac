"""Shared machinery of the distributed optimizers: byte-counted collectives, flat parameter
buffers, ZeRO-1 shard bounds, mask encodings, input checks, and the dense data-parallel wrapper
used for the AdamW / AdamS baselines.

Byte accounting (``comm_stats``): every collective goes through :class:`Comm`, which adds
``numel * element_size`` of the tensor *this rank hands in* to a per-step counter under a kind
(``grad_values``, ``param_values``, ``mask``). This is the quantity the SCAPE issue asks for; for a
ring implementation the bytes a rank actually puts on the wire are ``(p-1)/p`` of the hand-in for
reduce-scatter, ``(p-1)`` times it for all-gather and ``2(p-1)/p`` of it for all-reduce (see
``docs/scape.md``). With ``torch.distributed`` not initialised (or a world of one) the collectives
are local copies, and the hand-in is still counted so byte counts describe the algorithm, not the
world size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .errors import ParameterError, check

KINDS = ("grad_values", "param_values", "mask")


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, group=group)


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any, async_op: bool) -> Any:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


class Comm:
    """Collectives over ``group`` (or local fall-backs), counting the bytes each rank hands in."""

    def __init__(self, process_group: Any = None) -> None:
        self.group = process_group
        if _dist_ready():
            self.rank = dist.get_rank(process_group)
            self.world = dist.get_world_size(process_group)
            check(self.rank >= 0, "process_group", process_group,
                  f"this process (global rank {dist.get_rank()}) is not a member of the group")
        else:
            check(process_group is None, "process_group", process_group,
                  "must be None when torch.distributed is not initialised")
            self.rank, self.world = 0, 1
        self.distributed = _dist_ready() and self.world > 1
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
    def all_reduce_(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """Sum ``t`` over ranks in place."""
        self._count(t, kind)
        if self.distributed:
            dist.all_reduce(t, group=self.group)
        return t

    def reduce_scatter(self, inp: torch.Tensor, kind: str) -> torch.Tensor:
        """Sum ``inp`` (``world`` equal chunks) over ranks; rank ``j`` gets chunk ``j``."""
        check(inp.numel() % self.world == 0, "reduce_scatter input size", inp.numel(),
              f"must be a multiple of the world size {self.world}")
        self._count(inp, kind)
        if not self.distributed:
            return inp.clone()
        out = torch.empty(inp.numel() // self.world, dtype=inp.dtype, device=inp.device)
        _reduce_scatter(out, inp.contiguous(), self.group)
        return out

    def all_gather(self, inp: torch.Tensor, kind: str, async_op: bool = False
                   ) -> tuple[torch.Tensor, Any]:
        """Concatenate every rank's ``inp`` (equal sizes) in rank order; returns ``(out, work)``,
        ``work`` being the handle to ``wait()`` on when ``async_op`` (``None`` if local)."""
        self._count(inp, kind)
        if not self.distributed:
            return inp.clone(), None
        out = torch.empty(inp.numel() * self.world, dtype=inp.dtype, device=inp.device)
        work = _all_gather(out, inp.contiguous(), self.group, async_op)
        return out, (work if async_op else None)

    # -- uncounted set-up collectives ----------------------------------------------------------
    def broadcast_(self, t: torch.Tensor, src_rank: int = 0) -> torch.Tensor:
        """Broadcast from group rank ``src_rank`` (set-up only, not counted per step)."""
        if self.distributed:
            src = dist.get_global_rank(self.group, src_rank) if self.group is not None else src_rank
            dist.broadcast(t, src=src, group=self.group)
        return t

    def gather_ints(self, values: list[int], device: torch.device) -> list[list[int]]:
        """Every rank's list of ints (set-up consistency checks, not counted)."""
        t = torch.tensor(values, dtype=torch.int64, device=device)
        if not self.distributed:
            return [values]
        out = torch.empty(t.numel() * self.world, dtype=torch.int64, device=device)
        _all_gather(out, t, self.group, False)
        return out.view(self.world, -1).tolist()


# ---------------------------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------------------------
def split_named(params: Iterable[Any]) -> tuple[list[torch.Tensor], list[str]]:
    """Accept tensors or ``(name, tensor)`` pairs; return tensors and display names."""
    tensors, names = [], []
    for i, p in enumerate(params):
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            names.append(p[0])
            p = p[1]
        else:
            names.append(f"params[{i}]")
        check(isinstance(p, torch.Tensor), names[-1], type(p).__name__, "must be a torch.Tensor")
        tensors.append(p)
    return tensors, names


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


def check_sparsity(sparsity: float, who: str) -> None:
    check(isinstance(sparsity, (int, float)) and not isinstance(sparsity, bool)
          and 0.0 <= float(sparsity) < 1.0, f"{who}.sparsity", sparsity,
          "must be a number in [0, 1) (fraction of coordinates NOT sent each step)")


def keep_count(sparsity: float, n: int) -> int:
    """Coordinates kept out of ``n``: ``ceil((1 - sparsity) * n)``, at least 1, at most ``n``."""
    return max(1, min(n, math.ceil(round((1.0 - sparsity) * n, 6))))


@dataclass(frozen=True)
class ShardLayout:
    """ZeRO-1 layout of a flat vector of ``n`` coordinates padded to ``n_pad = world * shard``.

    Rank ``j`` owns ``[j * shard, (j + 1) * shard)``; the padding (at most ``world - 1``
    coordinates, all in the last shard) always holds zeros.
    """

    n: int
    world: int

    @property
    def shard(self) -> int:
        return -(-self.n // self.world)

    @property
    def n_pad(self) -> int:
        return self.shard * self.world

    def bounds(self, rank: int) -> tuple[int, int]:
        return rank * self.shard, (rank + 1) * self.shard


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

    def __init__(self, params: list[torch.Tensor], n_pad: int | None = None) -> None:
        self.params = params
        self.numels = [p.numel() for p in params]
        self.n = sum(self.numels)
        n_pad = self.n if n_pad is None else n_pad
        p0 = params[0]
        self.flat = torch.zeros(n_pad, dtype=p0.dtype, device=p0.device)
        off = 0
        with torch.no_grad():
            for p, k in zip(params, self.numels):
                self.flat[off:off + k].copy_(p.detach().reshape(-1))
                p.data = self.flat[off:off + k].view_as(p)
                off += k

    def gather_grads(self, out: torch.Tensor) -> torch.Tensor:
        """Copy the gradients into ``out[:n]`` (``out`` zero beyond ``n``)."""
        return grads_to_flat(self.params, out)

    def check_still_bound(self, who: str) -> None:
        """Detect a model moved / re-created after the optimizer was built."""
        for i, p in enumerate(self.params):
            if p.data.untyped_storage().data_ptr() != self.flat.untyped_storage().data_ptr():
                raise ParameterError(f"{who}.params[{i}]", "re-allocated",
                                     "parameters were moved or replaced after the optimizer "
                                     "was built (e.g. model.to(device)); build it after")


# ---------------------------------------------------------------------------------------------
# masks: selection and encoding
# ---------------------------------------------------------------------------------------------
def select_topk_sorted(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores, sorted ascending (a canonical, deterministic order)."""
    if k >= score.numel():
        return torch.arange(score.numel(), device=score.device)
    return torch.topk(score, k, sorted=False).indices.sort().values


def mask_encoding(size: int, k: int) -> str:
    """``"index"`` (k int32) or ``"bitmap"`` (ceil(size/8) bytes), whichever is smaller."""
    return "index" if 4 * k <= -(-size // 8) else "bitmap"


def encode_mask(local_idx: torch.Tensor, size: int, kind: str) -> torch.Tensor:
    """Encode sorted indices in ``[0, size)`` as int32 indices or a little-endian bitmap."""
    if kind == "index":
        return local_idx.to(torch.int32)
    nbytes = -(-size // 8)
    bits = torch.zeros(nbytes * 8, dtype=torch.uint8, device=local_idx.device)
    bits[local_idx] = 1
    weights = (1 << torch.arange(8, device=local_idx.device, dtype=torch.int32))
    return (bits.view(nbytes, 8).to(torch.int32) * weights).sum(1).to(torch.uint8)


def decode_mask(buf: torch.Tensor, size: int, kind: str) -> torch.Tensor:
    """Inverse of :func:`encode_mask`: sorted int64 indices."""
    if kind == "index":
        return buf.to(torch.int64)
    shifts = torch.arange(8, device=buf.device, dtype=torch.int32)
    bits = (buf.to(torch.int32).unsqueeze(1) >> shifts) & 1
    return bits.reshape(-1)[:size].nonzero().squeeze(1)


def encoded_nbytes(size: int, k: int) -> int:
    """Bytes of one rank's encoded mask (what it hands to the mask all-gather)."""
    return 4 * k if mask_encoding(size, k) == "index" else -(-size // 8)


# ---------------------------------------------------------------------------------------------
# dense data parallel (baselines)
# ---------------------------------------------------------------------------------------------
class DenseDP:
    """Dense data parallelism around any ``torch.optim.Optimizer`` (AdamW / AdamS baselines).

    ``loss.backward(); opt.step()``: ``step`` all-reduces the flattened gradient (one collective,
    counted as ``grad_values``), divides by the world size and lets the inner optimizer step on the
    mean gradient; every rank keeps the full optimizer state (plain DDP, no sharding), so no
    parameters are exchanged. Parameters are broadcast from rank 0 at construction.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, process_group: Any = None) -> None:
        check(isinstance(optimizer, torch.optim.Optimizer), "DenseDP.optimizer",
              type(optimizer).__name__, "must be a torch.optim.Optimizer")
        self.optimizer = optimizer
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.params, self.names = split_named(params)
        check_params(self.params, self.names, "DenseDP")
        self.comm = Comm(process_group)
        self.n = sum(p.numel() for p in self.params)
        check_same_size(self.comm, [self.n], self.params[0].device, "DenseDP")
        with torch.no_grad():
            for p in self.params:
                self.comm.broadcast_(p.data)
        self._buf = torch.zeros(self.n, dtype=self.params[0].dtype, device=self.params[0].device)

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

