"""Raw-gradient top-k with error feedback, per tensor, around AdamS (the SCAPE paper's foil) or
AdamW: 2-process gloo runs against a simulation of every worker in one process, replica
identity, byte counts, clipping, checkpoints and bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist

from _dist_helpers import flat, make_params, rank_grads, run_workers
from lmrepro.errors import ParameterError
from lmrepro.optim import AdamS, NonFiniteGradientError, TopKEF

SHAPES = [(60, 50), (40, 25), (31,)]
HP = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def _inner(kind: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    if kind == "adams":
        return AdamS(params, bias_correction=True, **HP)
    return torch.optim.AdamW(params, foreach=False, **HP)


class _RefTopK:
    """Every worker's residual simulated in one process: per tensor, each worker keeps the top
    ceil(d n) of |r + g| (1-D tensors whole), the mean of the sparse contributions is clipped
    and handed to the inner optimizer."""

    def __init__(self, p0: torch.Tensor, world: int, density: float, kind: str,
                 max_norm: float | None) -> None:
        self.p = p0.clone().requires_grad_(True)
        self.opt = _inner(kind, [self.p])
        self.r = torch.zeros(world, p0.numel())
        self.density, self.max_norm = density, max_norm

    def step(self, grads: list[torch.Tensor]) -> None:
        dense = torch.zeros_like(self.r[0])
        for j, g in enumerate(grads):
            a = self.r[j] + g
            off = 0
            for s in SHAPES:
                n = math.prod(s)
                k = n if len(s) == 1 else math.ceil(round(self.density * n, 6))
                idx = off + torch.topk(a[off:off + n].abs(), k).indices
                dense[idx] += a[idx]
                a[idx] = 0
                off += n
            self.r[j] = a
        dense = dense / len(grads)
        if self.max_norm is not None:
            coef = self.max_norm / (dense.double().norm().item() + 1e-6)
            if coef < 1:
                dense = dense * coef
        self.p.grad = dense
        self.opt.step()


def _worker(rank: int, world: int) -> dict:
    out = {}
    for kind in ("adams", "adamw"):
        ps = make_params(SHAPES)
        ref = _RefTopK(flat(ps), world, 0.01, kind, 2.0)
        opt = TopKEF(_inner(kind, ps), sparsity=0.99, max_grad_norm=2.0)
        n = flat(ps).numel()
        for t in range(4):
            for p, g in zip(ps, rank_grads(t, rank, SHAPES)):
                p.grad = g
            opt.step()
            ref.step([flat(rank_grads(t, r, SHAPES)) for r in range(world)])
            mine = flat(ps)
            assert (mine - ref.p.detach()).abs().max() <= 1e-6, (kind, t)
            assert torch.allclose(opt.residual, ref.r[rank], atol=1e-6), (kind, t)
            others = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(others, mine)
            assert all(torch.equal(o, mine) for o in others), (kind, t)
            stats = opt.comm_stats()
            k = 30 + 10                                   # ceil(1 % of 3000) + ceil(1 % of 1000)
            assert stats["grad_values"] == 4 * (31 + k + 1)   # 1-D whole, top-k, finite flag
            assert stats["mask"] == 4 * k and stats == opt.expected_bytes()
        out[kind] = opt.coverage()
        assert 0 < opt.coverage() <= world * 4 * 40 / (n - 31)
    # a non-finite gradient on one rank: every rank raises, nothing moves
    ps = make_params(SHAPES)
    opt = TopKEF(_inner("adams", ps), sparsity=0.9)
    before = flat(ps)
    g = rank_grads(0, rank, SHAPES)
    if rank == 1:
        g[0][0, 0] = float("nan")
    for p, gi in zip(ps, g):
        p.grad = gi
    with pytest.raises(NonFiniteGradientError, match="must be finite"):
        opt.step()
    assert torch.equal(flat(ps), before)
    return out


@pytest.mark.timeout(120)
def test_topk_two_workers_match_simulation():
    res = run_workers(_worker, 2)
    assert res[0] == res[1] and res[0]["adams"] > 0


def test_single_process_state_roundtrip():
    ps, qs = make_params(SHAPES), make_params(SHAPES)
    a = TopKEF(_inner("adams", ps), sparsity=0.9)
    for t in range(2):
        for p, g in zip(ps, rank_grads(t, 0, SHAPES)):
            p.grad = g
        a.step()
    b = TopKEF(_inner("adams", qs), sparsity=0.9)
    with torch.no_grad():
        for p, q in zip(ps, qs):
            q.copy_(p)
    b.load_state_dict(copy.deepcopy(a.state_dict()))   # as if read back from disk
    for t in range(2, 4):
        for p, q, g in zip(ps, qs, rank_grads(t, 0, SHAPES)):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    assert torch.equal(flat(ps), flat(qs)) and torch.equal(a.residual, b.residual)


def test_bad_input():
    ps = make_params(SHAPES)
    with pytest.raises(ParameterError, match=r"TopKEF\.sparsity = 1.0"):
        TopKEF(_inner("adams", ps), sparsity=1.0)
    with pytest.raises(ParameterError, match=r"TopKEF\.optimizer"):
        TopKEF(ps, sparsity=0.9)                               # type: ignore[arg-type]
    with pytest.raises(ParameterError, match=r"TopKEF\.max_grad_norm = -1"):
        TopKEF(_inner("adams", ps), sparsity=0.9, max_grad_norm=-1)
    opt = TopKEF(_inner("adams", make_params(SHAPES)), sparsity=0.5)
    with pytest.raises(ParameterError, match=r"params\[0\].*grad"):
        opt.step()


def test_topk_takes_the_sparse_methods_sparsity_schedule():
    """Top-k ramps its sparsity up as SCAPE does (sparsity_at): dense steps first (then it is
    the inner optimizer on the gradient itself, with an empty residual), then linear to the
    target, then the target, whose bytes are expected_bytes()."""
    from lmrepro.optim import sparsity_at

    ps, qs = make_params(SHAPES), make_params(SHAPES)
    opt = TopKEF(_inner("adams", ps), sparsity=0.99, dense_steps=1, sparsity_warmup_steps=4)
    ref = _inner("adams", qs)
    n = flat(ps).numel()
    for t in range(7):
        grads = rank_grads(t, 0, SHAPES)
        for p, q, g in zip(ps, qs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        d = 1 - sparsity_at(t, 0.99, 1, 0.0, 4)
        assert opt.sparsity_of_step(t) == sparsity_at(t, 0.99, 1, 0.0, 4)
        kept = sum(n_ if len(s) == 1 else math.ceil(round(d * n_, 6))
                   for s in SHAPES for n_ in [math.prod(s)])
        assert opt.last_step_info["sparsity"] == pytest.approx(1 - kept / n)
        if t == 0:                          # dense: exactly the inner optimizer
            ref.step()
            assert torch.equal(flat(ps), flat(qs)) and not opt.residual.any()
    assert opt.comm_stats() == opt.expected_bytes()
    state = opt.state_dict()
    assert state["step"] == 7
    other = TopKEF(_inner("adams", make_params(SHAPES)), sparsity=0.99, dense_steps=1,
                   sparsity_warmup_steps=4)
    other.load_state_dict(copy.deepcopy(state))
    assert other.sparsity_of_step(other._step) == 0.99 and other._step == 7


def test_topk_bad_schedule():
    ps = make_params(SHAPES)
    with pytest.raises(ParameterError, match=r"TopKEF\.sparsity_warmup_steps = -1"):
        TopKEF(_inner("adams", ps), sparsity=0.9, sparsity_warmup_steps=-1)
    with pytest.raises(ParameterError, match=r"TopKEF\.sparsity_start = 1"):
        TopKEF(_inner("adams", ps), sparsity=0.9, sparsity_start=1)


def _momentum(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> torch.Tensor:
    """The inner optimizer's first moment, flat (zeros before its first step)."""
    return flat([opt.state[p].get("m", opt.state[p].get("exp_avg", torch.zeros_like(p)))
                 if p in opt.state else torch.zeros_like(p) for p in params])


@pytest.mark.parametrize("kind", ["adams", "adamw"])
def test_off_mask_momentum_rules_and_diagnostics(kind):
    """"decay" (top-k's own): off the coordinates sent the inner momentum decays by b1 and the
    coordinates keep moving; off_mask_mass is that movement's share of sum |u| (weight decay
    taken out). "zero" (SCAPE's rule): m = 0 there, they move by weight decay alone, and the
    residual holds b1 m / (1 - b1) besides the unsent gradient (deferred, not lost).
    recent_coverage is the fraction of the top-k tensors sent at least once (under 100 steps:
    ever)."""
    lr, wd, b1 = HP["lr"], HP["weight_decay"], HP["betas"][0]
    n_top = sum(math.prod(s) for s in SHAPES if len(s) > 1)
    for rule in ("decay", "zero"):
        ps = make_params(SHAPES)
        inner = _inner(kind, ps)
        opt = TopKEF(inner, sparsity=0.95, off_mask_momentum=rule)
        for t in range(5):
            grads = rank_grads(t, 0, SHAPES)
            for p, g in zip(ps, grads):
                p.grad = g
            before, m_prev = flat(ps), _momentum(inner, ps)
            a = opt.residual + flat(grads)
            opt.step()
            sent = opt.last_in == t
            m = _momentum(inner, ps)
            u = (before * (1 - lr * wd) - flat(ps)).abs()      # one group: every tensor decays
            info = opt.last_step_info
            if rule == "zero":
                assert not m[~sent].any()
                assert u[~sent].max() < 1e-6                  # rounding; lr |u| ~ 1e-2 on it
                assert info["off_mask_mass"] < 1e-4
                assert torch.allclose(opt.residual[~sent], (a + b1 / (1 - b1) * m_prev)[~sent],
                                      rtol=1e-5, atol=1e-6)
            else:
                assert torch.allclose(m[~sent], b1 * m_prev[~sent])
                share = (u[~sent].double().sum() / u.double().sum()).item()
                assert info["off_mask_mass"] == pytest.approx(share, rel=1e-3, abs=1e-6)
                assert (t == 0) == (share < 1e-4)
            ever = (opt.ever.sum().item() - (flat(ps).numel() - n_top)) / n_top
            assert info["recent_coverage"] == pytest.approx(ever) == pytest.approx(opt.coverage())
        if rule == "decay":
            assert info["off_mask_mass"] > 0.3       # the dense momentum moves most of it


def test_off_mask_rule_bad_input():
    with pytest.raises(ParameterError, match=r"TopKEF\.off_mask_momentum = 'keep': must be one"):
        TopKEF(_inner("adams", make_params(SHAPES)), sparsity=0.9, off_mask_momentum="keep")
