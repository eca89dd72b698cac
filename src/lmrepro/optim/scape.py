"""SCAPE: sparse-communication data-parallel AdamS with ZeRO-1 sharding (arXiv 2607.01678).

Usage (no DDP wrapper: the optimizer communicates the gradient itself)::

    opt = SCAPE(model.parameters(), lr=3e-4, sparsity=0.99)   # after init_process_group
    loss.backward()
    opt.step()          # collective: every rank must call it, every step

Algorithm as implemented (``DESIGN.md``, section "SCAPE"; deviations in ``docs/scape.md``).
Parameters are flattened to ``N`` coordinates (padded to ``p * S``), rank ``j`` owns the shard
``[j S, (j+1) S)`` of the first moment ``m`` and of the fp32 master parameters (ZeRO-1). Each rank
keeps an error-feedback residual ``r`` of the full length. With ``k = ceil(rho * S)`` coordinates
kept per shard (``rho = 1 - sparsity``), step ``t`` on rank ``i``:

1. wait for the mask ``M_t`` whose all-gather was started (``async_op=True``) at the end of step
   ``t-1`` (the one-step delay that hides it behind forward/backward);
2. ``a = r + g``; ``b = a[M_t]`` (``p * k`` values, grouped by owner because ``M_t`` is sorted and
   every shard contributes ``k``); ``r = a`` with ``M_t`` zeroed;
3. ONE collective: reduce-scatter of ``b``: owner ``j`` receives the sum over ranks of its ``k``
   values; ``gbar = sum / p``;
4. the owner applies AdamS (:func:`lmrepro.optim.adams.adams_update`) on its ``k`` masked
   coordinates from that single buffer: ``m`` and ``v`` come from ``gbar`` and the previous ``m``;
   off-mask coordinates are left untouched (their gradient mass waits in ``r``; weight decay is
   applied only where the update is, see docs);
5. all-gather of the ``k`` updated master values per owner (``rho * N`` values in total) written
   into every replica at ``M_t``;
6. the owner scores its shard (default ``|m|``, pluggable), keeps the top ``k`` as ``M_{t+1}``,
   encodes them as int32 indices or a bitmap (whichever is smaller) and starts their all-gather
   asynchronously.

Step 0 has no mask yet and ``m = 0`` (every score ties), so step 0 is a *dense warm-start*: all
coordinates are reduced and updated (``r`` stays 0), which fills ``m`` with ``(1-b1) gbar`` so
the first mask ranks coordinates by the magnitude of the first averaged gradient rather than by
an arbitrary tie-break. With ``sparsity = 0`` every step is dense and SCAPE is exactly AdamS on
the averaged gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .adams import adams_update, check_hyperparameters
from .comm import (Comm, FlatParams, ShardLayout, check_grads, check_params, check_same_size,
                   check_sparsity, decode_mask, encode_mask, encoded_nbytes, keep_count,
                   mask_encoding, select_topk_sorted, split_named)
from .errors import ParameterError, check

MaskScore = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def score_m_abs(m: torch.Tensor, v: torch.Tensor | None) -> torch.Tensor:
    """``|m|``: the paper's first-moment statistic (default)."""
    return m.abs()


def score_m_over_sqrt_v(m: torch.Tensor, v: torch.Tensor | None, eps: float = 1e-8
                        ) -> torch.Tensor:
    """``|m| / (sqrt(v) + eps)``: the magnitude of the AdamS step each coordinate would take,
    ``v`` being the last rebuilt second moment of that coordinate (0 where never updated)."""
    assert v is not None
    return m.abs() / (v.sqrt() + eps)


MASK_SCORES: dict[str, tuple[MaskScore, bool]] = {
    # name -> (function, needs the stored last v)
    "m_abs": (score_m_abs, False),
    "m_over_sqrt_v": (score_m_over_sqrt_v, True),
}


class SCAPE(torch.optim.Optimizer):
    """Sparse-communication AdamS with ZeRO-1 sharding (arXiv 2607.01678); see module docstring.

    Args:
        params: parameters (or ``(name, tensor)`` pairs for clearer errors); one group only.
        lr, betas, eps, weight_decay: AdamS hyper-parameters (arXiv 2505.16363).
        sparsity: fraction of coordinates NOT communicated per step, in ``[0, 1)``.
        process_group: ``torch.distributed`` group (default: the world); without an initialised
            process group the optimizer runs alone with local collectives.
        mask_score: ``"m_abs"`` (default), ``"m_over_sqrt_v"``, or a callable
            ``(m_shard, v_shard_or_None) -> score`` (then ``v`` is not stored).
        dense_first_step: step 0 updates every coordinate (see module docstring). If False,
            step 0 uses the first ``k`` coordinates of each shard (a fixed arbitrary mask).
        record_masks: keep ``last_mask_used`` / ``last_mask_computed`` (global indices) for
            inspection; costs nothing but a reference.

    The model's parameters are re-pointed into one flat buffer at construction; build the
    optimizer after moving the model to its device. Parameters are broadcast from group rank 0
    at construction so every replica starts identical.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, sparsity: float = 0.99,
                 process_group: Any = None, mask_score: str | MaskScore = "m_abs",
                 dense_first_step: bool = True, record_masks: bool = False) -> None:
        check_hyperparameters(lr, betas, eps, weight_decay, prefix="SCAPE")
        check_sparsity(sparsity, "SCAPE")
        if isinstance(mask_score, str):
            check(mask_score in MASK_SCORES, "SCAPE.mask_score", mask_score,
                  f"must be one of {sorted(MASK_SCORES)} or a callable (m, v) -> score")
            self._score_fn, self._keep_v = MASK_SCORES[mask_score]
        else:
            check(callable(mask_score), "SCAPE.mask_score", mask_score,
                  "must be a name or a callable (m, v) -> score")
            self._score_fn, self._keep_v = mask_score, False
        tensors, self._names = split_named(params)
        check_params(tensors, self._names, "SCAPE")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(tensors, defaults)
        check(len(self.param_groups) == 1, "SCAPE.params", f"{len(self.param_groups)} groups",
              "must be a single parameter group (SCAPE shards one flat vector)")
        self.sparsity = float(sparsity)
        self.mask_score = mask_score if isinstance(mask_score, str) else "custom"
        self.dense_first_step = bool(dense_first_step)
        self.record_masks = bool(record_masks)
        self._params: list[torch.Tensor] = self.param_groups[0]["params"]

        self.comm = Comm(process_group)
        p0 = self._params[0]
        self.device = p0.device
        n = sum(p.numel() for p in self._params)
        self.layout = ShardLayout(n, self.comm.world)
        self.k = keep_count(self.sparsity, self.layout.shard)
        self.mask_kind = mask_encoding(self.layout.shard, self.k)
        check_same_size(self.comm, [n, self.k], self.device, "SCAPE")

        self.flat = FlatParams(self._params, self.layout.n_pad)
        self.comm.broadcast_(self.flat.flat)
        lo, hi = self.layout.bounds(self.comm.rank)
        self._lo = lo
        self.master = self.flat.flat[lo:hi].to(torch.float32).clone()
        self.m = torch.zeros(self.layout.shard, dtype=torch.float32, device=self.device)
        self.v = torch.zeros_like(self.m) if self._keep_v else None
        self.residual = torch.zeros(self.layout.n_pad, dtype=torch.float32, device=self.device)
        # Padding coordinates never win the mask unless a shard has fewer real coordinates than k.
        self._pad_local = torch.arange(lo, hi, device=self.device) >= n
        self._grad = torch.zeros(self.layout.n_pad, dtype=torch.float32, device=self.device)
        self._step = 0
        self._pending: tuple[torch.Tensor, Any] | None = None   # (gathered buffer, work handle)
        self.last_mask_used: torch.Tensor | None = None
        self.last_mask_computed: torch.Tensor | None = None

    # -- public helpers --------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return self._step

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank handed to collectives in the last step, by kind, and ``total``."""
        return self.comm.stats()

    def expected_bytes(self, dense: bool = False) -> dict[str, int]:
        """Analytic hand-in bytes of one step (dense: a warm-start / sparsity-0 step)."""
        lay, vb = self.layout, 4
        pb = self._params[0].element_size()
        if dense or self.k == lay.shard:
            grad, par = lay.n_pad * vb, lay.shard * pb
        else:
            grad, par = lay.world * self.k * vb, self.k * pb
        sparse_mask = self.k < lay.shard
        mask = encoded_nbytes(lay.shard, self.k) if sparse_mask else 0
        return {"grad_values": grad, "param_values": par, "mask": mask,
                "total": grad + par + mask}

    # -- the step ----------------------------------------------------------------------------------
    def _take_mask(self) -> torch.Tensor | None:
        """The global mask for this step (sorted int64), or None for a dense step."""
        if self.k == self.layout.shard:
            return None
        if self._pending is None:
            if self._step == 0 and self.dense_first_step:
                return None
            if self._step == 0:
                base = torch.arange(self.k, device=self.device)
                return (base.unsqueeze(0) + self.layout.shard *
                        torch.arange(self.comm.world, device=self.device).unsqueeze(1)).reshape(-1)
            raise RuntimeError("SCAPE internal error: no mask pending after step 0")
        buf, work = self._pending
        if work is not None:
            work.wait()
        self._pending = None
        return self._decode_gathered(buf)

    def _decode_gathered(self, buf: torch.Tensor) -> torch.Tensor:
        s = self.layout.shard
        parts = buf.view(self.comm.world, -1)
        return torch.cat([decode_mask(parts[j], s, self.mask_kind) + j * s
                          for j in range(self.comm.world)])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One SCAPE step; collective over the process group (see module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        check_grads(self._params, self._names, "SCAPE")
        self.flat.check_still_bound("SCAPE")
        group = self.param_groups[0]
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        comm, lay, rank = self.comm, self.layout, self.comm.rank
        comm.begin_step()

        mask = self._take_mask()                       # 1. delayed mask M_t
        self.flat.gather_grads(self._grad)
        a = self.residual.add_(self._grad)             # 2. a = r + g (in the residual buffer)
        if mask is None:
            b = a.clone()
            a.zero_()
        else:
            b = a[mask]
            a.index_fill_(0, mask, 0.0)                # r = a with M_t zeroed
        gbar = comm.reduce_scatter(b, "grad_values")   # 3. the one gradient collective
        gbar.div_(comm.world)

        if mask is None:                               # 4. AdamS on the owner's masked coords
            own = torch.arange(lay.shard, device=self.device)
        else:
            own = mask[rank * self.k:(rank + 1) * self.k] - self._lo
        new_p, new_m, new_v = adams_update(self.master[own], gbar, self.m[own], lr, b1, b2, eps,
                                           wd)
        self.master[own] = new_p
        self.m[own] = new_m
        if self.v is not None:
            self.v[own] = new_v

        values = new_p.to(self.flat.flat.dtype)        # 5. sparse parameter all-gather
        gathered, _ = comm.all_gather(values, "param_values")
        if mask is None:
            self.flat.flat.copy_(gathered)
        else:
            self.flat.flat[mask] = gathered
        self.last_mask_used = mask if self.record_masks else None

        if self.k < lay.shard:                         # 6. M_{t+1}, all-gathered asynchronously
            score = self._score_fn(self.m, self.v).masked_fill(self._pad_local, -float("inf"))
            local = select_topk_sorted(score, self.k)
            if self.record_masks:
                self.last_mask_computed = local + self._lo
            enc = encode_mask(local, lay.shard, self.mask_kind)
            self._pending = comm.all_gather(enc, "mask", async_op=True)
        self._step += 1
        comm.end_step()
        return loss

    # -- checkpointing -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard state (m, master, optional v), its residual, the step, and the next
        mask already gathered (waits for the in-flight all-gather). Tensors and plain types only:
        loadable with ``torch.load(weights_only=True)``."""
        next_mask = None
        if self._pending is not None:
            buf, work = self._pending
            if work is not None:
                work.wait()
            self._pending = (buf, None)
            next_mask = buf.clone()
        g = self.param_groups[0]
        return {
            "format": "lmrepro.SCAPE/1", "step": self._step, "rank": self.comm.rank,
            "world": self.comm.world, "n": self.layout.n, "k": self.k,
            "sparsity": self.sparsity, "mask_kind": self.mask_kind,
            "m": self.m.clone(), "master": self.master.clone(),
            "v": None if self.v is None else self.v.clone(),
            "residual": self.residual.clone(), "next_mask": next_mask,
            "hyper": {"lr": g["lr"], "beta1": g["betas"][0], "beta2": g["betas"][1],
                      "eps": g["eps"], "weight_decay": g["weight_decay"]},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state saved by the same rank of an identical set-up. The model parameters
        must be restored separately (they are replicated; the master shard here must match)."""
        check(isinstance(state, dict) and state.get("format") == "lmrepro.SCAPE/1",
              "SCAPE state_dict", type(state).__name__, "must come from SCAPE.state_dict()")
        for key, mine in (("rank", self.comm.rank), ("world", self.comm.world),
                          ("n", self.layout.n), ("k", self.k), ("mask_kind", self.mask_kind)):
            if state[key] != mine:
                raise ParameterError(f"SCAPE state_dict[{key!r}]", state[key],
                                     f"must equal this optimizer's {mine} (same world size, "
                                     "model and sparsity)")
        self._step = int(state["step"])
        self.m.copy_(state["m"])
        self.master.copy_(state["master"])
        if self.v is not None and state["v"] is not None:
            self.v.copy_(state["v"])
        self.residual.copy_(state["residual"])
        nm = state["next_mask"]
        self._pending = None if nm is None else (nm.to(self.device), None)
        h = state["hyper"]
        g = self.param_groups[0]
        g.update(lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                 weight_decay=h["weight_decay"])
