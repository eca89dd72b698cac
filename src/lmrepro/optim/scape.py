"""SCAPE: sparse-communication data-parallel AdamS (arXiv 2607.01678), as its authors formulate it.

Usage (no DDP wrapper: the optimizer communicates itself; a drop-in ``torch.optim.Optimizer``
with parameter groups and ``torch.optim.lr_scheduler``)::

    opt = SCAPE([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0}],
                lr=3e-4, betas=(0.9, 0.95), sparsity=0.99, max_grad_norm=1.0)
    loss.backward()
    opt.step()          # collective: every rank of the group must call it, every step

The algorithm (docs/papers.md, "SCAPE"; docs/scape.md states it as implemented) is read from
the authors' public Megatron-LM reducer (GitHub ``mz687/SCAPE_SC26``,
``megatron/core/distributed/fp8_topk_adams_reducer.py``, the ``TopKPerLayerSyncMomentumAdamS``
``ReducerV2`` classes; facts and formulas only, no code). Per step ``t`` (``t = 1, 2, ...`` for the
bias correction) on worker ``i``, with ``m`` the first moment (identical on every worker, zero off
the current mask) and ``r_i`` the worker's residual in momentum units:

1. ``c_i = b1 m + (1 - b1) g_i + r_i`` (corrected momentum, local);
2. ``M_t`` = the mask chosen at step ``t - 1``; its asynchronous all-gather ran during this step's
   forward/backward (the one-step delay);
3. ONE all-reduce of ``c_i[M_t]`` (plus one flag saying whether this worker's gradient is
   finite): ``m_t = mean_i c_i`` on ``M_t``, ``0`` off it; ``r_i = c_i`` with ``M_t`` zeroed;
4. ``gt = (m_t - b1 m_{t-1}) / (1 - b1)`` on ``M_t`` (the synced gradient rebuilt from the one
   buffer); clipped to ``max_grad_norm`` by its global norm (identical on every replica: no extra
   collective), after which ``m_t = b1 m_{t-1} + (1 - b1) gt`` is rebuilt from the clipped ``gt``;
   ``v_t = b2 m_{t-1}^2 + (1 - b2) gt^2``;
5. every coordinate: ``p -= lr (m_t bc1 / (sqrt(v_t) bc2 + eps) + wd p)`` with ``bc1 = 1/(1-b1^t)``,
   ``bc2 = 1/sqrt(1-b2^t)`` (``bias_correction=False``: both 1, exactly AdamS's formula); off the
   mask ``m_t = 0``, so only the weight decay moves them, locally, with no bytes;
6. ``M_{t+1}``: the owner of each tensor (contiguous, numel-balanced ownership) keeps the top
   ``k = max(1, ceil(d(t+1) numel))`` of ``|c_owner|`` (its LOCAL ``c`` from 1., before the
   update) per tensor; the owners' choices are combined by an asynchronous all-gather (int32
   indices or a bitmap of the owned span, whichever is smaller) that the next step waits for.

Tensors with one dimension (norms, biases) are sent whole every step when
``exclude_1d_from_topk`` (the default, as the authors'). The sparsity follows
:func:`~lmrepro.optim.scape_layout.sparsity_at`: ``dense_steps`` dense steps, then linear from
``sparsity_start`` to the target over ``sparsity_warmup_steps``; ``d(t)`` above is
``1 - sparsity``, the fraction kept. A step with no mask yet (step 0 while sparse) bootstraps it
synchronously from the owners' ``c``.

``mask_rule="stale_m"`` is our first reading, kept as a named ablation: workers send ``g_i + r_i``
(gradient units) on the mask, ``m`` and ``v`` are updated only on the mask and ``m`` stays frozen
elsewhere, the mask ranks the frozen ``|m|``, and a step without a mask is dense.

State per worker: ``m`` and ``r`` (fp32, ``N`` each), the mask of the step and the next one,
and a bit per coordinate recording whether it was ever selected (coverage); with parameters of
another dtype an fp32 master copy. No optimizer state is sharded (the authors' runs used the
non-distributed-optimizer path): see docs/scape.md for bytes per parameter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .adams import bias_corrections
from .comm import (Comm, FlatParams, all_finite, check_grads, check_params, check_same_size,
                   clip_coefficient, keep_count, nonfinite_error, pack_bits, topk_indices,
                   unpacked_indices)
from .errors import check
from .scape_layout import (apply_update, build_layout, checked_groups, density_at,
                           mask_diagnostics, off_mask_direction, off_mask_mass, recent_fraction)
from .scape_state import Pending, restore, state_of

__all__ = ["SCAPE"]



class SCAPE(torch.optim.Optimizer):
    """Sparse-communication AdamS (arXiv 2607.01678); see the module docstring.

    Args:
        params: tensors, ``(name, tensor)`` pairs (``model.named_parameters()``: errors name
            the parameter) or parameter groups (dicts with ``params`` and optionally ``lr``,
            ``weight_decay`` and ``names``). All on one device, one floating dtype.
        lr, betas, eps, weight_decay: the AdamS hyper-parameters (arXiv 2505.16363); ``lr`` and
            ``weight_decay`` may differ per group, decoupled decay hits every coordinate.
        sparsity: target fraction of each tensor's coordinates NOT sent per step, in [0, 1)
            (0.99: 1 % sent); 0 is dense AdamS on the averaged gradient.
        dense_steps, sparsity_start, sparsity_warmup_steps: the sparsity schedule
            (:func:`~lmrepro.optim.scape_layout.sparsity_at`).
        exclude_1d_from_topk: send 1-D tensors (norms, biases) whole every step.
        bias_correction: Adam's bias correction (the authors' default); False gives exactly
            AdamS's formula.
        max_grad_norm: clip the synced gradient to this global norm (None: no clipping).
        mask_rule: ``"ef_momentum"`` (the authors') or ``"stale_m"`` (the ablation).
        off_mask_momentum: ``"zero"`` (the authors': ``m = 0`` off the mask) or ``"decay"`` (an
            ablation: AdamS with no gradient there, ``m <- b1 m``, so coordinates keep moving
            after they leave the mask; the residual keeps only what was not synced).
        process_group: ``torch.distributed`` group (default: the world); without an initialised
            process group the optimizer runs alone with local collectives.

    Parameters are re-pointed into one flat buffer at construction (build the optimizer after
    moving the model to its device) and broadcast from group rank 0.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, sparsity: float = 0.99, *, dense_steps: int = 0,
                 sparsity_start: float = 0.0, sparsity_warmup_steps: int = 0,
                 exclude_1d_from_topk: bool = True, bias_correction: bool = True,
                 max_grad_norm: float | None = None, mask_rule: str = "ef_momentum",
                 decay_scope: str = "all", off_mask_momentum: str = "zero",
                 process_group: Any = None) -> None:
        who = "SCAPE"
        groups = checked_groups(params, lr, betas, eps, weight_decay, sparsity, dense_steps,
                                sparsity_start, sparsity_warmup_steps,
                                {"exclude_1d_from_topk": exclude_1d_from_topk,
                                 "bias_correction": bias_correction},
                                max_grad_norm, mask_rule, decay_scope, off_mask_momentum)
        all_params = [p for g in groups for p in g["params"]]
        all_names = [n for g in groups for n in g["names"]]
        check_params(all_params, all_names, who)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        self._building = True
        super().__init__(groups, defaults)
        self._building = False

        self.sparsity, self.dense_steps = float(sparsity), int(dense_steps)
        self.sparsity_start = float(sparsity_start)
        self.sparsity_warmup_steps = int(sparsity_warmup_steps)
        # the math works with the fraction kept, density = 1 - sparsity
        self._density, self._density_start = 1.0 - self.sparsity, 1.0 - self.sparsity_start
        self.exclude_1d_from_topk = bool(exclude_1d_from_topk)
        self.bias_correction = bool(bias_correction)
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.mask_rule = mask_rule
        self.decay_scope = decay_scope
        self.off_mask_momentum = off_mask_momentum
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)

        self.comm = Comm(process_group)
        self._params, self._names = all_params, all_names
        self.device = all_params[0].device
        self.n = sum(p.numel() for p in all_params)
        check(self.n < 2 ** 31, f"{who}.params", f"{self.n} coordinates",
              "must hold fewer than 2**31 coordinates (int32 mask indices)")
        check_same_size(self.comm, [self.n, len(all_params)], self.device, who)

        self.layout = layout = build_layout(self.param_groups, self.exclude_1d_from_topk,
                                            self.comm.world, self.device)
        self.slots, self.group_bounds = layout.slots, layout.group_bounds
        self._owned = layout.owned_by(self.comm.rank)
        self._spans, self._excluded_idx = layout.spans, layout.excluded_idx
        self.n_excluded, self.n_eligible = layout.n_excluded, self.n - layout.n_excluded
        self._allocate_state(all_params)

    def _allocate_state(self, all_params: list[torch.Tensor]) -> None:
        """The flat parameters (broadcast from rank 0), ``m``, residual, workspaces, mask state."""
        dev = self.device
        self.flat = FlatParams(all_params)
        self.comm.broadcast_(self.flat.flat)
        f32 = torch.float32
        self.master = (self.flat.flat if self.flat.flat.dtype == f32
                       else self.flat.flat.to(f32).clone())
        self.m = torch.zeros(self.n, dtype=f32, device=dev)
        self.residual = torch.zeros(self.n, dtype=f32, device=dev)
        self._c = torch.zeros(self.n, dtype=f32, device=dev)       # workspace: c of this step
        self._g = torch.zeros(self.n, dtype=f32, device=dev)       # workspace: local gradient
        self._payload = torch.zeros(self.n + 1, dtype=f32, device=dev)
        self.ever = torch.zeros(self.n, dtype=torch.bool, device=dev)
        self.ever_at_target = torch.zeros(self.n, dtype=torch.bool, device=dev)
        # the last step each coordinate was in the mask (-1: never), for the mask diagnostics
        self.last_in = torch.full((self.n,), -1, dtype=torch.int64, device=dev)
        self._support: torch.Tensor | None = None   # where m may be non-zero (None: anywhere)
        self._pending: Pending | None = None
        self._step = 0
        self._sparse_steps = 0
        self._target_steps = 0
        self.last_step_info: dict[str, Any] = {}
        self.keep_corrected = False          # keep a copy of each step's c (diagnostics)
        self.last_corrected: torch.Tensor | None = None

    # -- torch.optim.Optimizer interface ---------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        check(getattr(self, "_building", False), "SCAPE.add_param_group", "after construction",
              "is not supported: SCAPE lays every parameter out in one flat buffer when it is "
              "built; pass all groups to the constructor")
        super().add_param_group(param_group)

    @property
    def num_steps(self) -> int:
        return self._step

    def sparsity_of_step(self, step: int) -> float:
        """The scheduled sparsity of step ``step`` (0-based):
        :func:`~lmrepro.optim.scape_layout.sparsity_at`."""
        return 1.0 - self._density_of_step(step)

    def _density_of_step(self, step: int) -> float:
        return density_at(step, self._density, self.dense_steps, self._density_start,
                          self.sparsity_warmup_steps)

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank handed to collectives in the last step, by kind, and ``total``."""
        return self.comm.stats()

    def mask_encoding(self, sparsity: float) -> tuple[str, int]:
        """How a mask at ``sparsity`` travels: :meth:`.scape_layout.Layout.mask_encoding`."""
        return self.layout.mask_encoding(1.0 - sparsity)

    def expected_bytes(self, step: int) -> dict[str, int]:
        """Analytic hand-in bytes of step ``step`` once running (not a bootstrap step)."""
        d, d_next = self._density_of_step(step), self._density_of_step(step + 1)
        k = self.n if d >= 1.0 else sum(self.layout.kept(d)) + self.n_excluded
        grad = 4 * (k + 1)
        mask = 0
        if d_next < 1.0:
            kind, size = self.layout.mask_encoding(d_next)
            mask = 4 * size if kind == "index" else size
        return {"grad_values": grad, "param_values": 0, "mask": mask, "total": grad + mask}

    # -- measurements ----------------------------------------------------------------------------
    def coverage(self, at_target: bool = False) -> float:
        """Fraction of the top-k tensors' coordinates selected at least once during the sparse
        steps so far (0 before the first); ``at_target``: during the steps at the target
        sparsity only (after the sparsity warm-up, whose lower sparsities select more)."""
        steps, ever = ((self._target_steps, self.ever_at_target) if at_target
                       else (self._sparse_steps, self.ever))
        if steps == 0 or self.n_eligible == 0:
            return 0.0
        return (int(ever.sum()) - self.n_excluded) / self.n_eligible

    def residual_norm(self) -> float:
        """L2 norm of this rank's residual, in gradient units (``stale_m``'s own; the momentum
        units of ``ef_momentum`` divided by ``1 - b1``), so the two rules compare."""
        norm = float(torch.linalg.vector_norm(self.residual, dtype=torch.float64))
        return norm / (1.0 - self.betas[0]) if self.mask_rule == "ef_momentum" else norm

    # -- masks ---------------------------------------------------------------------------------
    def _select_owned(self, source: torch.Tensor, density: float) -> torch.Tensor:
        """This rank's choice for its owned tensors: global indices, ascending."""
        parts = [topk_indices(source[s.offset:s.offset + s.numel].abs(),
                              keep_count(density, s.numel)).to(source.device) + s.offset
                 for s in self._owned]
        if not parts:
            return torch.zeros(0, dtype=torch.int64, device=source.device)
        return torch.cat(parts)

    def _launch_mask(self, source: torch.Tensor, density: float, async_op: bool) -> Pending:
        """Select this rank's part of the mask of ``density`` and start gathering the parts."""
        own = self._select_owned(source, density)
        pend = Pending(density=density, own=own)
        kind, size = self.layout.mask_encoding(density)
        if kind == "index":
            send = torch.zeros(size, dtype=torch.int32, device=self.device)
            send[:own.numel()] = own.to(torch.int32)
        else:
            lo, hi = self._spans[self.comm.rank]
            bits = torch.zeros(hi - lo, dtype=torch.bool, device=self.device)
            bits[own - lo] = True
            send = torch.zeros(size, dtype=torch.uint8, device=self.device)
            packed = pack_bits(bits).to(self.device)
            send[:packed.numel()] = packed
        pend.buf, pend.work = self.comm.all_gather(send, "mask", async_op=async_op)
        return pend

    def _decode(self, pend: Pending) -> torch.Tensor:
        """Wait for a pending mask and return its global indices (owners' parts in rank order,
        then the excluded tensors)."""
        if pend.idx is not None:
            return pend.idx
        if pend.work is not None:
            pend.work.wait()
            pend.work = None
        assert pend.buf is not None and pend.own is not None
        kind, _ = self.layout.mask_encoding(pend.density)
        kept = self.layout.kept(pend.density)
        rows = pend.buf.view(self.comm.world, -1)
        parts = []
        for j in range(self.comm.world):
            if j == self.comm.rank:
                parts.append(pend.own)
            elif kind == "index":
                parts.append(rows[j, :kept[j]].to(torch.int64))
            else:
                lo, hi = self._spans[j]
                parts.append(unpacked_indices(rows[j], hi - lo).to(self.device) + lo)
        pend.idx = torch.cat(parts + [self._excluded_idx])
        pend.buf = None
        return pend.idx

    def _current_mask(self, density: float, c: torch.Tensor) -> torch.Tensor | None:
        """``M_t`` as global indices, or None for a dense step."""
        pend, self._pending = self._pending, None
        if density >= 1.0:
            if pend is not None:          # a schedule that goes back to dense: drop it
                self._decode(pend)
            return None
        if pend is not None and pend.density == density:
            return self._decode(pend)
        if pend is not None:
            self._decode(pend)            # stale density (e.g. a changed schedule): rebuild
        if self.mask_rule == "stale_m":
            return None                   # no ranking yet: a dense step (as before the revision)
        # bootstrap: the owners choose from their local c now, synchronously (the authors' too)
        return self._decode(self._launch_mask(c, density, async_op=False))

    # -- the step ----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One SCAPE step; collective over the process group (see the module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        check_grads(self._params, self._names, "SCAPE")
        self.flat.check_still_bound("SCAPE")
        t = self._step
        d_now, d_next = self._density_of_step(t), self._density_of_step(t + 1)
        self.comm.begin_step()
        info: dict[str, Any] = {}
        c, finite = self._corrected_momentum()                          # 1.
        if self.keep_corrected:     # a diagnostic copy (the mask-agreement probe), off by default
            self.last_corrected = c.clone()
        idx, s, nxt = self._exchange(c, finite, d_now, d_next, info)    # 2., 3. (6. launched)
        s, u = self._direction(s, idx, t, info)                         # 4.
        if idx is None:
            self.last_in.fill_(t)
        else:
            info.update(mask_diagnostics(idx, u, t, self.last_in, self.n_excluded))
            info["recent_coverage"] = recent_fraction(self.last_in, t, self.n_excluded)
            info["off_mask_mass"] = 0.0
            if self.off_mask_momentum == "decay":
                u = self._decayed_direction(idx, u, t, info)
        self._keep(idx, s, c)                                           # m, and r = c off M_t
        self._apply_update(None if u.numel() == self.n else idx, u)     # 5. every coordinate
        if self.mask_rule == "stale_m" and d_next < 1.0:
            nxt = self._launch_mask(self.m, d_next, async_op=True)
        self._pending = nxt
        if idx is not None:
            self.ever.index_fill_(0, idx, True)
            self._sparse_steps += 1
            if d_now == self._density:
                self.ever_at_target.index_fill_(0, idx, True)
                self._target_steps += 1
        # the sparsity reached: the excluded tensors, sent whole, count as sent
        info["sparsity"] = 1.0 - (self.n if idx is None else idx.numel()) / self.n
        self.last_step_info = info
        self._step += 1
        self.comm.end_step()
        return loss

    def _corrected_momentum(self) -> tuple[torch.Tensor, bool]:
        """``c = b1 m + (1 - b1) g + r`` (``stale_m``: ``g + r``, gradient units) in the workspace,
        and whether this rank's gradient is finite."""
        b1 = self.betas[0]
        g = self.flat.gather_grads(self._g)
        finite = all_finite(g)
        c = self._c
        if self.mask_rule == "ef_momentum":
            torch.mul(self.m, b1, out=c).add_(g, alpha=1.0 - b1).add_(self.residual)
        else:
            torch.add(g, self.residual, out=c)
        return c, finite

    def _exchange(self, c: torch.Tensor, finite: bool, d_now: float, d_next: float,
                  info: dict[str, Any]
                  ) -> tuple[torch.Tensor | None, torch.Tensor, Pending | None]:
        """``M_t`` (waiting for its all-gather), the one all-reduce of ``c`` on it, and the next
        mask launched while the payload travels: ``(M_t or None when dense, the mean of c on
        M_t, the next mask in flight)``. Raises when any rank's gradient was not finite."""
        t0 = time.perf_counter()
        idx = self._current_mask(d_now, c)
        info["mask_wait_s"] = time.perf_counter() - t0
        k = self.n if idx is None else idx.numel()
        buf = self._payload[:k + 1]
        if idx is None:
            buf[:k].copy_(c)
        else:
            torch.index_select(c, 0, idx, out=buf[:k])
        buf[k] = 0.0 if finite else 1.0
        work = self.comm.all_reduce_(buf, "grad_values", async_op=True)
        nxt = None
        if self.mask_rule == "ef_momentum" and d_next < 1.0:     # overlaps the payload
            nxt = self._launch_mask(c, d_next, async_op=True)
        t0 = time.perf_counter()
        if work is not None:
            work.wait()
        info["payload_wait_s"] = time.perf_counter() - t0
        bad = int(round(float(buf[k])))
        if bad > 0:
            if nxt is not None:
                self._decode(nxt)
            self._pending = Pending(density=d_now, idx=idx) if idx is not None else None
            raise nonfinite_error("SCAPE", self._params, self._names, bad, self.comm)
        world = self.comm.world
        return idx, (buf[:k] if world == 1 else buf[:k].div(world)), nxt

    def _direction(self, s: torch.Tensor, idx: torch.Tensor | None, t: int,
                   info: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """From the synced ``s`` on ``M_t``: the gradient rebuilt and clipped, then
        ``(m_t, u)`` with ``u = m_t bc1 / (sqrt(v_t) bc2 + eps)`` (the step is ``lr u``)."""
        b1, b2 = self.betas
        m_prev = self.m if idx is None else self.m.index_select(0, idx)
        if self.mask_rule == "ef_momentum":         # the synced gradient from the one buffer
            gt = (s - b1 * m_prev) / (1.0 - b1)
        else:
            gt = s
            s = b1 * m_prev + (1.0 - b1) * gt
        norm = float(torch.linalg.vector_norm(gt, dtype=torch.float64))
        info["grad_norm"] = norm
        if self.max_grad_norm is not None:
            coef = clip_coefficient(norm, self.max_grad_norm)
            if coef < 1.0:
                gt = gt * coef
                s = b1 * m_prev + (1.0 - b1) * gt
        v = b2 * m_prev.square() + (1.0 - b2) * gt.square()
        bc1, bc2 = bias_corrections(t + 1, b1, b2, self.bias_correction)
        if bc1 == 1.0 and bc2 == 1.0:
            return s, s / (v.sqrt() + self.eps)
        return s, (s * bc1) / (v.sqrt() * bc2 + self.eps)

    def _decayed_direction(self, idx: torch.Tensor, u: torch.Tensor, t: int,
                           info: dict[str, Any]) -> torch.Tensor:
        """``off_mask_momentum="decay"``: the step on every coordinate, ``u`` on ``M_t`` and
        AdamS with a zero gradient off it (:func:`.scape_layout.off_mask_direction`)."""
        bc1, bc2 = bias_corrections(t + 1, *self.betas, self.bias_correction)
        full = off_mask_direction(self.m, *self.betas, self.eps, bc1, bc2)
        full.index_copy_(0, idx, u)
        on = torch.zeros(self.n, dtype=torch.bool, device=self.device)
        on[idx] = True
        info["off_mask_mass"] = off_mask_mass(full.abs(), on)
        return full

    def _keep(self, idx: torch.Tensor | None, s: torch.Tensor, c: torch.Tensor) -> None:
        """``m``: the synced value on ``M_t``, 0 off it (``decay``: ``b1 m`` off it); the
        residual: ``c`` with ``M_t`` zeroed (``decay``: less ``b1 m``, which ``m`` carries)
        (the workspace and the residual swap, no copy)."""
        if idx is None:
            self.m.copy_(s)
            self.residual.zero_()
        elif self.off_mask_momentum == "decay":
            c.sub_(self.m, alpha=self.betas[0])
            self.m.mul_(self.betas[0]).index_copy_(0, idx, s)
            c.index_fill_(0, idx, 0.0)
            self._c, self.residual = self.residual, c
        else:
            if self.mask_rule == "ef_momentum":
                if self._support is None:
                    self.m.zero_()
                else:
                    self.m.index_fill_(0, self._support, 0.0)
            self.m.index_copy_(0, idx, s)
            c.index_fill_(0, idx, 0.0)
            self._c, self.residual = self.residual, c
        self._support = (idx if self.mask_rule == "ef_momentum"
                         and self.off_mask_momentum == "zero" else None)

    def _apply_update(self, idx: torch.Tensor | None, u: torch.Tensor) -> None:
        """``p <- p (1 - lr wd) - lr u`` (:func:`.scape_layout.apply_update`) on the master copy,
        then into the parameters."""
        apply_update(self.master, self.param_groups, self.group_bounds, idx, u, self.decay_scope)
        if self.master is not self.flat.flat:
            self.flat.flat.copy_(self.master)

    # -- checkpointing -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's state (:func:`.scape_state.state_of`): ``torch.load(weights_only=True)``
        loads it; the model's parameters are saved with the model."""
        return state_of(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state saved by the same rank of an identical set-up
        (:func:`.scape_state.restore`); restore the model's parameters separately."""
        restore(self, state)
