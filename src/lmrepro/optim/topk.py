"""Raw-gradient top-k sparsification with error feedback, per tensor, around an inner optimizer
(AdamS: the SCAPE paper's foil; or AdamW).

Each rank ``i`` forms ``a_i = r_i + g_i`` (gradient units), keeps per tensor the ``k = max(1,
ceil((1 - sparsity) * numel))`` coordinates of largest ``|a_i|`` (its OWN mask: masks differ between
ranks), and all-gathers their values and indices (indices as int32 or a bitmap, whichever is
smaller); 1-D tensors are sent whole when ``exclude_1d_from_topk`` (as SCAPE does). Every rank sums
the ``p`` sparse contributions in rank order, divides by ``p``, clips the result to
``max_grad_norm`` (global norm, identical on every rank: the same clipping as SCAPE's and the
dense baselines'), and lets the inner optimizer step on it; the residual keeps what was not sent,
``r_i = a_i`` with the sent coordinates zeroed (Stich et al. 2018; Lin et al. 2018). The inner
optimizer keeps its dense momentum (``off_mask_momentum="decay"``: a coordinate keeps moving for
as long as its momentum lasts after it was sent); ``"zero"`` applies SCAPE's rule instead, the
inner first moment zeroed off the coordinates sent this step before the inner step, so exactly
the sent coordinates move (besides the weight decay). The optimizer
state is replicated, so no parameters are exchanged. Top-k of the raw gradient feeds Adam a sparse,
bursty gradient whose second moment no longer matches its first: the instability at high sparsity
that SCAPE's momentum mask avoids (arXiv 2607.01678).
"""

from __future__ import annotations

from typing import Any

import torch

from .comm import (Comm, all_finite, check_grads, check_max_grad_norm, check_sparsity,
                   check_params, check_same_size, clip_coefficient, flat_to_grads, grads_to_flat,
                   keep_count, nonfinite_error, pack_bits, params_and_names, topk_indices,
                   unpacked_indices)
from .errors import check
from .scape_layout import (OFF_MASK_MOMENTUM, density_at, excluded_indices, off_mask_mass,
                           recent_fraction)


class TopKEF:
    """Per-tensor top-k of ``|r + g|`` with error feedback, then ``optimizer`` on the mean sparse
    gradient. ``loss.backward(); opt.step()`` on every rank (the step is collective). Without an
    initialised process group it runs alone with local collectives. Parameter groups, their
    ``lr`` and ``weight_decay`` are the inner optimizer's (``param_groups`` is its list)."""

    def __init__(self, optimizer: torch.optim.Optimizer, sparsity: float = 0.99, *,
                 exclude_1d_from_topk: bool = True, max_grad_norm: float | None = None,
                 dense_steps: int = 0, sparsity_start: float = 0.0,
                 sparsity_warmup_steps: int = 0, off_mask_momentum: str = "decay",
                 process_group: Any = None) -> None:
        who = "TopKEF"
        check(isinstance(optimizer, torch.optim.Optimizer), f"{who}.optimizer",
              type(optimizer).__name__, "must be a torch.optim.Optimizer (AdamS or AdamW)")
        check_sparsity(sparsity, f"{who}.sparsity")
        check(isinstance(exclude_1d_from_topk, bool), f"{who}.exclude_1d_from_topk",
              exclude_1d_from_topk, "must be True or False")
        check_max_grad_norm(max_grad_norm, f"{who}.max_grad_norm")
        for name, steps in (("dense_steps", dense_steps),
                            ("sparsity_warmup_steps", sparsity_warmup_steps)):
            check(isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0,
                  f"{who}.{name}", steps, "must be an integer >= 0")
        check_sparsity(sparsity_start, f"{who}.sparsity_start")
        check(off_mask_momentum in OFF_MASK_MOMENTUM, f"{who}.off_mask_momentum",
              off_mask_momentum, f"must be one of {OFF_MASK_MOMENTUM}")
        self.off_mask_momentum = off_mask_momentum
        self.optimizer = optimizer
        self.sparsity = float(sparsity)
        # the sparsity schedule SCAPE uses (optim.scape_layout.sparsity_at), so both sparse
        # methods of a comparison ramp up alike; the math works with the fraction kept, 1 - sparsity
        self.dense_steps, self.sparsity_start = int(dense_steps), float(sparsity_start)
        self.sparsity_warmup_steps = int(sparsity_warmup_steps)
        self._density, self._density_start = 1.0 - self.sparsity, 1.0 - self.sparsity_start
        self.exclude_1d_from_topk = exclude_1d_from_topk
        self.max_grad_norm = max_grad_norm
        self._params, self._names = params_and_names(optimizer)
        check_params(self._params, self._names, who)
        self.comm = Comm(process_group)
        dev = self._params[0].device
        self.n = sum(p.numel() for p in self._params)
        self._slots: list[tuple[int, int, bool]] = []
        off = 0
        for p in self._params:
            self._slots.append((off, p.numel(), exclude_1d_from_topk and p.dim() <= 1))
            off += p.numel()
        self._excluded_idx = excluded_indices(self._slots, dev)
        self.n_excluded = self._excluded_idx.numel()
        self.k = self._kept(self._density)
        self.index_mask = 4 * self.k <= -(-self.n // 8)
        check_same_size(self.comm, [self.n, self.k], dev, who)
        with torch.no_grad():
            for p in self._params:
                self.comm.broadcast_(p.data)
        self.residual = torch.zeros(self.n, dtype=torch.float32, device=dev)
        self._dense = torch.zeros(self.n, dtype=torch.float32, device=dev)
        self.ever = torch.zeros(self.n, dtype=torch.bool, device=dev)
        self._sent = torch.zeros(self.n, dtype=torch.bool, device=dev)    # this step's union
        self.last_in = torch.full((self.n,), -1, dtype=torch.int64, device=dev)
        self.last_selected = torch.zeros(0, dtype=torch.int64, device=dev)
        self._sparse_steps = 0
        self._step = 0
        self.last_step_info: dict[str, Any] = {}

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank handed to collectives in the last step, by kind, and ``total``."""
        return self.comm.stats()

    def sparsity_of_step(self, step: int) -> float:
        """The scheduled sparsity of step ``step`` (0-based):
        :func:`optim.scape_layout.sparsity_at`."""
        return 1.0 - self._density_of_step(step)

    def _density_of_step(self, step: int) -> float:
        return density_at(step, self._density, self.dense_steps, self._density_start,
                          self.sparsity_warmup_steps)

    def _kept(self, density: float) -> int:
        """Coordinates of the top-k tensors one rank sends at ``density = 1 - sparsity``."""
        return sum(keep_count(density, k) for _, k, ex in self._slots if not ex)

    def expected_bytes(self) -> dict[str, int]:
        """Analytic hand-in bytes of a step at the target sparsity."""
        grad = 4 * (self.n_excluded + self.k + 1)
        mask = 4 * self.k if self.index_mask else -(-self.n // 8)
        return {"grad_values": grad, "param_values": 0, "mask": mask, "total": grad + mask}

    def coverage(self, at_target: bool = False) -> float:
        """Fraction of the top-k tensors' coordinates any rank has sent at least once, over
        every sparse step (``at_target``, SCAPE's signature, is accepted and changes nothing)."""
        eligible = self.n - self.n_excluded
        if self._sparse_steps == 0 or eligible == 0:
            return 0.0
        return (int(self.ever.sum()) - self.n_excluded) / eligible

    def residual_norm(self) -> float:
        """L2 norm of this rank's residual (gradient units)."""
        return float(torch.linalg.vector_norm(self.residual, dtype=torch.float64))

    @torch.no_grad()
    def step(self) -> None:
        check_grads(self._params, self._names, "TopKEF")
        comm, world = self.comm, self.comm.world
        comm.begin_step()
        g = grads_to_flat(self._params, self._dense)
        finite = all_finite(g)
        a = self.residual + g
        density = self._density_of_step(self._step)
        kk = self._kept(density)
        index_mask = 4 * kk <= -(-self.n // 8)
        parts = [topk_indices(a[o:o + k].abs(), keep_count(density, k)).to(a.device) + o
                 for o, k, ex in self._slots if not ex]
        sel = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=a.device)
        self.last_selected = sel        # this rank's own choice (the masks' overlap diagnostics)
        e = self.n_excluded
        vals = torch.cat([a.index_select(0, self._excluded_idx), a.index_select(0, sel),
                          torch.tensor([0.0 if finite else 1.0], device=a.device)])
        all_vals, _ = comm.all_gather(vals, "grad_values")
        if index_mask:
            all_idx, _ = comm.all_gather(sel.to(torch.int32), "mask")
        else:
            bits = torch.zeros(self.n, dtype=torch.bool, device=a.device)
            bits[sel] = True
            all_idx, _ = comm.all_gather(pack_bits(bits).to(a.device), "mask")
        val_rows = all_vals.view(world, -1)
        bad = int(round(float(val_rows[:, -1].sum())))
        if bad > 0:
            raise nonfinite_error("TopKEF", self._params, self._names, bad, comm)
        idx_rows = all_idx.view(world, -1)
        dense = self._dense.zero_()
        sent = self._sent.zero_()
        for j in range(world):
            if j == comm.rank:
                idx_j = sel
            elif index_mask:
                idx_j = idx_rows[j].to(torch.int64)
            else:
                idx_j = unpacked_indices(idx_rows[j], self.n).to(a.device)
            dense.index_add_(0, idx_j, val_rows[j, e:e + kk])
            sent.index_fill_(0, idx_j, True)
        if e:
            dense.index_add_(0, self._excluded_idx, val_rows[:, :e].sum(0))
            sent.index_fill_(0, self._excluded_idx, True)
        self.ever.logical_or_(sent)
        self.last_in.masked_fill_(sent, self._step)
        dense.div_(world)
        a.index_fill_(0, sel, 0.0)
        if e:
            a.index_fill_(0, self._excluded_idx, 0.0)
        self.residual = a
        norm = float(torch.linalg.vector_norm(dense, dtype=torch.float64))
        coef = clip_coefficient(norm, self.max_grad_norm)
        if coef < 1.0:
            dense.mul_(coef)
        flat_to_grads(dense, self._params)
        if self.off_mask_momentum == "zero":
            self._zero_momentum_off(sent)
        before = torch.cat([p.detach().reshape(-1).float() for p in self._params])
        self.optimizer.step()
        self.last_step_info = {"sparsity": 1.0 - (kk + e) / self.n, "grad_norm": norm,
                               "recent_coverage": recent_fraction(self.last_in, self._step, e),
                               "off_mask_mass": off_mask_mass(self._step_size(before), sent)}
        self._sparse_steps += 1
        self._step += 1
        comm.end_step()

    def _zero_momentum_off(self, sent: torch.Tensor) -> None:
        """SCAPE's rule on the inner optimizer: its first moment (``m``, AdamS; ``exp_avg``,
        AdamW) zeroed off the coordinates sent this step, and parked in this rank's residual
        as ``b1 m / (1 - b1)`` (gradient units), as SCAPE's residual keeps ``b1 m`` off its
        mask: momentum is deferred, not lost."""
        for p, (off, k, _) in zip(self._params, self._slots):
            st = self.optimizer.state.get(p, {})
            for key in ("m", "exp_avg"):
                if key in st:
                    b1 = self._beta1(p)
                    keep = sent[off:off + k]
                    m = st[key].reshape(-1)
                    self.residual[off:off + k].add_(m * ~keep, alpha=b1 / (1.0 - b1))
                    m.mul_(keep)

    def _beta1(self, p: torch.Tensor) -> float:
        return float(next(g for g in self.optimizer.param_groups
                          if any(q is p for q in g["params"]))["betas"][0])

    def _step_size(self, before: torch.Tensor) -> torch.Tensor:
        """``|u|`` per coordinate of the inner step just taken, ``p <- p (1 - lr wd) - lr u``
        (the decoupled weight decay of AdamS and AdamW taken out)."""
        out = torch.empty_like(before)
        by_param = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        for p, (off, k, _) in zip(self._params, self._slots):
            g = by_param[id(p)]
            lr, wd = float(g["lr"]), float(g.get("weight_decay", 0.0))
            was = before[off:off + k]
            if lr == 0.0:
                out[off:off + k] = 0.0
            else:
                out[off:off + k] = (was * (1.0 - lr * wd) - p.detach().reshape(-1)).abs() / lr
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "residual": self.residual.clone(),
                "ever": self.ever.clone(), "last_in": self.last_in.clone(),
                "sparse_steps": self._sparse_steps, "step": self._step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check(isinstance(state, dict) and {"optimizer", "residual"} <= set(state),
              "TopKEF state_dict", type(state).__name__, "must come from TopKEF.state_dict()")
        self.optimizer.load_state_dict(state["optimizer"])
        self.residual.copy_(state["residual"])
        self.ever.copy_(state["ever"])
        if "last_in" in state:      # states saved before the diagnostics have none
            self.last_in.copy_(state["last_in"])
        self._sparse_steps = int(state["sparse_steps"])
        self._step = int(state.get("step", self._sparse_steps))
