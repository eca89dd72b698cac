"""Top-k + error feedback over AdamW (the SCAPE paper's baseline): a 2-process gloo run against a
simulation of every worker in one process, replica identity and byte counts."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist

from _dist_helpers import flat, make_params, rank_grads, run_workers
from lmrepro.errors import ParameterError
from lmrepro.optim import TopKEF

BIG = [(100, 150), (5001,)]
HP = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


class _RefTopK:
    """Every worker's residual simulated in one process; AdamW on the mean sparse gradient."""

    def __init__(self, p0: torch.Tensor, world: int, sparsity: float) -> None:
        self.p = p0.clone().requires_grad_(True)
        self.opt = torch.optim.AdamW([self.p], foreach=False, **HP)
        self.r = torch.zeros(world, p0.numel())
        self.k = math.ceil(round((1 - sparsity) * p0.numel(), 6))

    def step(self, grads: list[torch.Tensor]) -> None:
        dense = torch.zeros_like(self.r[0])
        for j, g in enumerate(grads):
            a = self.r[j] + g
            idx = torch.topk(a.abs(), self.k).indices
            dense[idx] += a[idx]
            a[idx] = 0
            self.r[j] = a
        self.p.grad = dense / len(grads)
        self.opt.step()


def _worker(rank: int, world: int) -> dict:
    ps = make_params(BIG)
    ref = _RefTopK(flat(ps), world, 0.99)
    opt = TopKEF(ps, sparsity=0.99, **HP)
    n = flat(ps).numel()
    for t in range(4):
        for p, g in zip(ps, rank_grads(t, rank, BIG)):
            p.grad = g
        opt.step()
        ref.step([flat(rank_grads(t, r, BIG)) for r in range(world)])
        mine = flat(ps)
        assert (mine - ref.p.detach()).abs().max() <= 1e-6, t
        assert torch.equal(opt.residual, ref.r[rank]), t
        others = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(others, mine)
        assert all(torch.equal(o, mine) for o in others), t
        stats = opt.comm_stats()
        rho_n = 0.01 * n
        assert abs(stats["grad_values"] - 4 * rho_n) <= 0.01 * 4 * rho_n
        assert abs(stats["mask"] - 4 * rho_n) <= 0.01 * 4 * rho_n      # int32 indices < bitmap
        assert stats["param_values"] == 0 and stats["total"] == stats["grad_values"] + stats["mask"]
    return {"ok": True}


@pytest.mark.timeout(120)
def test_topk_two_workers_match_simulation():
    res = run_workers(_worker, 2)
    assert res[0]["ok"] and res[1]["ok"]


def test_single_process_state_roundtrip():
    ps, qs = make_params(BIG), make_params(BIG)
    a = TopKEF(ps, sparsity=0.9, **HP)
    for t in range(2):
        for p, g in zip(ps, rank_grads(t, 0, BIG)):
            p.grad = g
        a.step()
    b = TopKEF(qs, sparsity=0.9, **HP)
    with torch.no_grad():
        for p, q in zip(ps, qs):
            q.copy_(p)
    b.load_state_dict(copy.deepcopy(a.state_dict()))   # as if read back from disk
    for t in range(2, 4):
        for p, q, g in zip(ps, qs, rank_grads(t, 0, BIG)):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    assert torch.equal(flat(ps), flat(qs)) and torch.equal(a.residual, b.residual)


def test_bad_input():
    with pytest.raises(ParameterError, match=r"TopKEF\.sparsity"):
        TopKEF(make_params(BIG), sparsity=1.0)
    opt = TopKEF(make_params(BIG), sparsity=0.5)
    with pytest.raises(ParameterError, match=r"params\[0\].*grad"):
        opt.step()
