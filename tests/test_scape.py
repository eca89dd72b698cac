"""SCAPE (arXiv 2607.01678): single-process checks and 2-/3-process gloo checks against an
independent reference simulation, AdamS at sparsity 0, replica identity, byte counts, the
one-step mask delay, error feedback, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from _dist_helpers import ReferenceSCAPE, flat, make_params, rank_grads, run_workers
from lmrepro.errors import ParameterError
from lmrepro.optim import SCAPE, AdamS, DenseDP
from lmrepro.optim.comm import decode_mask, encode_mask, keep_count, mask_encoding

SMALL = [(13, 7), (29,), (5, 3, 2)]            # N = 150
BIG = [(100, 150), (5001,)]                    # N = 20001: rho*N large enough for 1 % checks
HP = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


# ----------------------------------------------------------------------------------------------
# single process (world of one, local collectives)
# ----------------------------------------------------------------------------------------------
def test_sparsity_zero_is_adams_single_process():
    ps, qs = make_params(SMALL), make_params(SMALL)
    opt, ref = SCAPE(ps, sparsity=0.0, **HP), AdamS(qs, **HP)
    for t in range(6):
        for p, q, g in zip(ps, qs, rank_grads(t, 0, SMALL)):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        assert torch.allclose(flat(ps), flat(qs), atol=1e-6, rtol=0)
    assert opt.comm_stats()["mask"] == 0


@pytest.mark.parametrize("sparsity", [0.9, 0.99])
def test_matches_reference_single_process(sparsity):
    ps = make_params(BIG)
    ref = ReferenceSCAPE(flat(ps), 1, sparsity, HP["lr"], HP["betas"], HP["eps"],
                         HP["weight_decay"])
    opt = SCAPE(ps, sparsity=sparsity, record_masks=True, **HP)
    for t in range(5):
        grads = rank_grads(t, 0, BIG)
        for p, g in zip(ps, grads):
            p.grad = g
        opt.step()
        used = ref.step([flat(grads)])
        assert torch.allclose(flat(ps), ref.params, atol=1e-6, rtol=0)
        if t > 0:
            assert torch.equal(opt.last_mask_used, used)


@pytest.mark.parametrize("size,k", [(1501, 16), (1501, 150), (8, 1), (9, 9), (20000, 2000)])
def test_mask_encoding_roundtrip(size, k):
    g = torch.Generator().manual_seed(size + k)
    idx = torch.randperm(size, generator=g)[:k].sort().values
    kind = mask_encoding(size, k)
    enc = encode_mask(idx, size, kind)
    assert enc.numel() * enc.element_size() == min(4 * k, math.ceil(size / 8)) or (
        kind == "index" and 4 * k == enc.numel() * 4)
    assert torch.equal(decode_mask(enc, size, kind), idx)


def test_keep_count():
    assert keep_count(0.99, 10000) == 100
    assert keep_count(0.9, 1501) == 151
    assert keep_count(0.0, 7) == 7
    assert keep_count(0.999999, 10) == 1


def test_delayed_mask_is_previous_steps_mask_single_process():
    ps = make_params(BIG)
    opt = SCAPE(ps, sparsity=0.99, record_masks=True, **HP)
    prev = None
    for t in range(4):
        for p, g in zip(ps, rank_grads(t, 0, BIG)):
            p.grad = g
        before_m = opt.m.clone()
        opt.step()
        if t == 0:
            assert opt.last_mask_used is None               # dense warm-start step
        else:
            assert torch.equal(opt.last_mask_used, prev)
            # the used mask came from |m| BEFORE this step's update, not after it
            assert torch.equal(prev, torch.topk(before_m.abs(), opt.k).indices.sort().values)
        prev = opt.last_mask_computed.clone()


def test_state_dict_roundtrip_continues_identically():
    ps, qs = make_params(BIG), make_params(BIG)
    a = SCAPE(ps, sparsity=0.9, **HP)
    for t in range(3):
        for p, g in zip(ps, rank_grads(t, 0, BIG)):
            p.grad = g
        a.step()
    state = a.state_dict()
    b = SCAPE(qs, sparsity=0.9, **HP)
    with torch.no_grad():
        for p, q in zip(ps, qs):
            q.copy_(p)
    b.load_state_dict(state)
    for t in range(3, 6):
        for p, q, g in zip(ps, qs, rank_grads(t, 0, BIG)):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
        assert torch.equal(flat(ps), flat(qs))


def test_m_over_sqrt_v_score_runs_and_differs():
    ps, qs = make_params(BIG), make_params(BIG)
    a = SCAPE(ps, sparsity=0.99, record_masks=True, **HP)
    b = SCAPE(qs, sparsity=0.99, record_masks=True, mask_score="m_over_sqrt_v", **HP)
    for t in range(3):
        for p, q, g in zip(ps, qs, rank_grads(t, 0, BIG)):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    assert b.v is not None and a.v is None
    assert not torch.equal(a.last_mask_computed, b.last_mask_computed)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), "0.9"])
def test_bad_sparsity(bad):
    with pytest.raises(ParameterError, match=r"SCAPE\.sparsity.*\[0, 1\)"):
        SCAPE(make_params(SMALL), sparsity=bad)


def test_missing_grad_names_parameter():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = SCAPE(model.named_parameters(), sparsity=0.5)
    model[0](torch.randn(2, 3)).sum().backward()        # second layer gets no gradient
    with pytest.raises(ParameterError, match=r"1\.weight.*grad.*loss\.backward"):
        opt.step()


def test_mixed_devices_rejected():
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, device="meta", requires_grad=True)
    with pytest.raises(ParameterError, match="one device"):
        SCAPE([a, b], sparsity=0.9)


def test_process_group_without_dist_rejected():
    with pytest.raises(ParameterError, match="process_group"):
        SCAPE(make_params(SMALL), sparsity=0.9, process_group=object())


# ----------------------------------------------------------------------------------------------
# multi-process (gloo)
# ----------------------------------------------------------------------------------------------
def _core_worker(rank: int, world: int) -> dict:
    out = {}
    # (a) sparsity 0 == dense AdamS on the averaged gradient
    ps, qs = make_params(SMALL), make_params(SMALL)
    opt, ref = SCAPE(ps, sparsity=0.0, **HP), AdamS(qs, **HP)
    for t in range(4):
        mine = rank_grads(t, rank, SMALL)
        mean = [sum(rank_grads(t, r, SMALL)[i] for r in range(world)) / world
                for i in range(len(SMALL))]
        for p, g in zip(ps, mine):
            p.grad = g
        for q, g in zip(qs, mean):
            q.grad = g
        opt.step()
        ref.step()
        assert (flat(ps) - flat(qs)).abs().max() <= 1e-6
    # (b) 90 % and 99 %: reference simulation, replicas, bytes, delayed mask, error feedback
    for sparsity in (0.9, 0.99):
        ps = make_params(BIG)
        sim = ReferenceSCAPE(flat(ps), world, sparsity, HP["lr"], HP["betas"], HP["eps"],
                             HP["weight_decay"])
        opt = SCAPE(ps, sparsity=sparsity, record_masks=True, **HP)
        n, prev_computed = flat(ps).numel(), None
        for t in range(5):
            grads = rank_grads(t, rank, BIG)
            for p, g in zip(ps, grads):
                p.grad = g
            a = opt.residual.clone()
            a[:n] += flat(grads)
            opt.step()
            used = sim.step([flat(rank_grads(t, r, BIG)) for r in range(world)])
            mine = flat(ps)
            assert (mine - sim.params).abs().max() <= 1e-6, (sparsity, t)
            # replicas bit-identical
            others = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(others, mine)
            assert all(torch.equal(o, mine) for o in others), (sparsity, t)
            # error feedback: r = a with the used mask zeroed, exactly
            expect_r = a.clone()
            if opt.last_mask_used is not None:
                expect_r[opt.last_mask_used] = 0
                assert torch.equal(opt.last_mask_used, used)
            else:
                expect_r.zero_()
            assert torch.equal(opt.residual, expect_r)
            # the mask used now is the union of the owners' masks computed one step earlier
            if t > 0:
                gathered = [torch.empty_like(prev_computed) for _ in range(world)]
                dist.all_gather(gathered, prev_computed)
                assert torch.equal(opt.last_mask_used, torch.cat(gathered))
            prev_computed = opt.last_mask_computed.clone()
            # bytes: analytic (hand-in per rank)
            stats = opt.comm_stats()
            rho = 1 - sparsity
            shard = math.ceil(n / world)
            if t == 0:      # dense warm-start
                assert stats["grad_values"] == shard * world * 4
                assert stats["param_values"] == shard * 4
            else:
                assert abs(stats["grad_values"] - rho * n * 4) <= 0.01 * rho * n * 4
                expect = rho * n / world * 4
                assert abs(stats["param_values"] - expect) <= 0.01 * expect
            mask_expect = min(4 * rho * shard, shard / 8)
            assert abs(stats["mask"] - mask_expect) <= 0.01 * mask_expect + 1
            assert stats["total"] == stats["grad_values"] + stats["param_values"] + stats["mask"]
            assert stats == opt.expected_bytes(dense=(t == 0))
        out[sparsity] = opt.mask_kind
    # (d) dense path: world W with batch B per rank == one process with batch W*B
    bsz = 4
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(world * bsz, 6, generator=gen), torch.randn(world * bsz, 3, generator=gen)
    for kind in ("adamw", "adams", "scape0"):
        torch.manual_seed(1)
        model, ref_model = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
        ref_model.load_state_dict(model.state_dict())
        if kind == "adamw":
            opt = DenseDP(torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1))
            ref = torch.optim.AdamW(ref_model.parameters(), lr=0.05, weight_decay=0.1)
        elif kind == "adams":
            opt = DenseDP(AdamS(model.parameters(), lr=0.05, weight_decay=0.1))
            ref = AdamS(ref_model.parameters(), lr=0.05, weight_decay=0.1)
        else:
            opt = SCAPE(model.parameters(), lr=0.05, weight_decay=0.1, sparsity=0.0)
            ref = AdamS(ref_model.parameters(), lr=0.05, weight_decay=0.1)
        for _ in range(4):
            sl = slice(rank * bsz, (rank + 1) * bsz)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
            opt.step()
            ref.zero_grad()
            torch.nn.functional.mse_loss(ref_model(x), y).backward()
            ref.step()
            diff = max((a - b).abs().max().item()
                       for a, b in zip(model.parameters(), ref_model.parameters()))
            assert diff <= 1e-6, (kind, diff)
        if kind != "scape0":
            n = sum(p.numel() for p in model.parameters())
            assert opt.comm_stats() == {"grad_values": 4 * n, "param_values": 0, "mask": 0,
                                        "total": 4 * n}
    # (c) mismatched parameter sizes across ranks -> ParameterError on every rank
    shapes = [(10 + rank,)]
    try:
        SCAPE(make_params(shapes), sparsity=0.5)
    except ParameterError as err:
        out["mismatch"] = str(err)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_multiprocess_core(world):
    res = run_workers(_core_worker, world)
    for r in range(world):
        assert res[r][0.9] == "bitmap" and res[r][0.99] == "index"
        assert "identical on every rank" in res[r]["mismatch"]
