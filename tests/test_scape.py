"""SCAPE (arXiv 2607.01678) as its authors formulate it: the sparsity schedule, ownership and
k as pure functions; single-process properties (dense AdamS at sparsity 0, clipping, the delayed
mask from the local corrected momentum, weight decay everywhere, parameter groups with an lr
scheduler, the stale_m ablation, checkpoints, a non-finite gradient); and 2-/3-process gloo runs
against a plain simulation of every worker (tests/_dist_helpers.ReferenceSCAPE), with replicas
bit-identical. Bad input at the end."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.distributed as dist

from _dist_helpers import (ReferenceSCAPE, flat, make_params, owners_by_numel, rank_grads,
                           run_workers)
from lmrepro.errors import ParameterError
from lmrepro.optim import SCAPE, AdamS, NonFiniteGradientError, sparsity_at
from lmrepro.optim.comm import keep_count
from lmrepro.optim.scape_layout import assign_owners

# two groups (decayed matrices, undecayed vectors), with 1-D tensors among them
SHAPES = [(40, 30), (50, 20), (30,), (25, 12), (17,)]
GROUPS = [0, 0, 1, 0, 1]
BETAS, EPS = (0.9, 0.99), 1e-8
HP = dict(lr=0.01, betas=BETAS, eps=EPS, weight_decay=0.1)


def grouped(ps: list[torch.Tensor], lrs: tuple[float, float] = (0.01, 0.02),
            wds: tuple[float, float] = (0.1, 0.0)) -> list[dict]:
    return [{"params": [p for p, g in zip(ps, GROUPS) if g == gi], "lr": lrs[gi],
             "weight_decay": wds[gi]} for gi in (0, 1)]


def flat_order(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """The optimizer's flat order: group-major."""
    return [t for gi in (0, 1) for t, g in zip(ts, GROUPS) if g == gi]


def set_grads(ps: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for p, g in zip(ps, grads):
        p.grad = g.clone()


# ----------------------------------------------------------------------------------------------
# pure functions
# ----------------------------------------------------------------------------------------------
def test_sparsity_schedule_is_dense_then_linear():
    s = [sparsity_at(t, 0.99, dense_steps=3, sparsity_start=0.0, warmup_steps=10)
         for t in range(16)]
    assert s[:3] == [0.0, 0.0, 0.0]
    assert s[3] == 0.0 and s[13:] == [0.99] * 3
    steps = [b - a for a, b in zip(s[3:13], s[4:14])]
    assert all(math.isclose(x, 0.099) for x in steps)            # linear in sparsity
    assert sparsity_at(0, 0.9) == pytest.approx(0.9)               # no warm-up: the target
    assert sparsity_at(5, 0.9, sparsity_start=0.5, warmup_steps=10) == pytest.approx(0.7)


def test_owners_are_contiguous_and_balanced():
    numels = [100, 300, 50, 50, 200, 100, 100, 100]
    for world in (1, 2, 3, 4):
        own = assign_owners(numels, world)
        assert own == owners_by_numel(numels, world)
        assert own == sorted(own) and own[0] == 0 and own[-1] == world - 1
        assert set(own) == set(range(world))
    assert assign_owners([10, 10], 4) == [0, 1]                  # fewer tensors than ranks
    held = [sum(n for n, o in zip(numels, assign_owners(numels, 2)) if o == r) for r in (0, 1)]
    assert held == [500, 500]


def test_keep_count_is_ceil_per_tensor():
    assert keep_count(0.01, 10_000) == 100
    assert keep_count(1 - 0.99, 10_000) == 100          # representation error of 1 - 0.99
    assert keep_count(0.01, 150) == 2                     # ceil(1.5)
    assert keep_count(0.01, 7) == 1                       # at least one
    assert keep_count(1.0, 7) == 7


# ----------------------------------------------------------------------------------------------
# one process
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias_correction", [False, True])
def test_sparsity_zero_is_adams(bias_correction):
    ps, qs = make_params(SHAPES), make_params(SHAPES)
    opt = SCAPE(grouped(ps), sparsity=0.0, bias_correction=bias_correction, **HP)
    ref = AdamS(grouped(qs), betas=BETAS, eps=EPS, bias_correction=bias_correction)
    for t in range(6):
        g = rank_grads(t, 0, SHAPES)
        set_grads(ps, g)
        set_grads(qs, g)
        opt.step()
        ref.step()
        # bias correction multiplies the early steps' rounding (of m rebuilt from the one
        # buffer) by up to 1/(1 - b1) = 10: the 1e-6 is for the AdamS formula
        assert (flat(ps) - flat(qs)).abs().max() <= (5e-6 if bias_correction else 1e-6)
    assert opt.comm_stats()["mask"] == 0 and opt.last_step_info["sparsity"] == 0.0


def test_clipping_is_the_global_norm_of_the_synced_gradient():
    """At sparsity 0 the synced gradient is the gradient: SCAPE clipping == clip_grad_norm_ then
    AdamS (m and v rebuilt from the clipped gradient)."""
    ps, qs = make_params(SHAPES), make_params(SHAPES)
    opt = SCAPE(ps, sparsity=0.0, bias_correction=False, max_grad_norm=0.5, **HP)
    ref = AdamS(qs, **HP)
    for t in range(4):
        g = rank_grads(t, 0, SHAPES)
        set_grads(ps, g)
        set_grads(qs, g)
        norm = torch.nn.utils.clip_grad_norm_(qs, 0.5)
        assert norm > 0.5                           # clipping really acts
        opt.step()
        ref.step()
        assert opt.last_step_info["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
        assert (flat(ps) - flat(qs)).abs().max() <= 1e-6


def test_matches_reference_single_process_with_schedule_and_groups():
    ps = make_params(SHAPES)
    sim = ReferenceSCAPE(flat(flat_order(ps)), [p.shape for p in flat_order(ps)],
                         sorted(GROUPS), [(0.01, 0.1), (0.02, 0.0)], 1, 0.05, BETAS, EPS,
                         dense_steps=1, density_start=0.5, warmup=2, max_grad_norm=2.0)
    opt = SCAPE(grouped(ps), sparsity=0.95, dense_steps=1, sparsity_start=0.5,
                sparsity_warmup_steps=2, max_grad_norm=2.0, betas=BETAS, eps=EPS)
    for t in range(7):
        g = rank_grads(t, 0, SHAPES)
        set_grads(ps, g)
        opt.step()
        sim.step([flat(flat_order(g))])
        assert torch.allclose(opt.master, sim.params, rtol=1e-6, atol=1e-6), t
        assert (opt.last_step_info["sparsity"] == 0.0) == (t == 0), t


def test_mask_is_chosen_from_the_corrected_momentum_one_step_early():
    """World 1: M_t = per-tensor top-k of |c_{t-1}| with c = b1 m + (1-b1) g + r (before the
    update), 1-D tensors whole; the residual is c with M_t zeroed; m is zero off M_t."""
    ps = make_params(SHAPES)
    opt = SCAPE(ps, sparsity=0.9, **HP)
    b1 = BETAS[0]
    expected_next = None
    for t in range(5):
        g = rank_grads(t, 0, SHAPES)
        set_grads(ps, g)
        c = b1 * opt.m + (1 - b1) * flat(g) + opt.residual
        used = expected_next
        if used is None:                            # step 0 bootstraps from this c
            used = torch.zeros_like(c, dtype=torch.bool)
            off = 0
            for s in SHAPES:
                n = math.prod(s)
                k = n if len(s) == 1 else keep_count(0.1, n)
                used[off + torch.topk(c[off:off + n].abs(), k).indices] = True
                off += n
        opt.step()
        assert torch.equal(opt.m != 0, used)
        assert torch.allclose(opt.residual, torch.where(used, torch.zeros(()), c), atol=1e-6)
        # the next mask: the same rule on this step's c
        nxt = torch.zeros_like(used)
        off = 0
        for s in SHAPES:
            n = math.prod(s)
            k = n if len(s) == 1 else keep_count(0.1, n)
            nxt[off + torch.topk(c[off:off + n].abs(), k).indices] = True
            off += n
        expected_next = nxt
    assert 0.0 < opt.coverage() < 1.0 and opt.residual_norm() > 0


def test_weight_decay_reaches_every_coordinate_of_its_group():
    ps = make_params(SHAPES)
    opt = SCAPE(grouped(ps, lrs=(0.1, 0.1), wds=(0.5, 0.0)), sparsity=0.99, **HP)
    set_grads(ps, rank_grads(0, 0, SHAPES))
    opt.step()                                      # a step with a mask: most coordinates off it
    before = [p.detach().clone() for p in ps]
    set_grads(ps, [torch.zeros_like(p) for p in ps])
    opt.m.zero_()
    opt.residual.zero_()                            # nothing to send: only decay can act
    opt.step()
    for p, b, gi in zip(ps, before, GROUPS):
        expect = b * (1 - 0.1 * 0.5) if gi == 0 else b
        assert torch.allclose(p.detach(), expect, atol=1e-7)


def test_parameter_groups_and_lr_scheduler():
    ps = make_params(SHAPES)
    opt = SCAPE(grouped(ps, lrs=(0.01, 0.001)), sparsity=0.9, **HP)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.0)
    lrs = []
    for t in range(4):
        set_grads(ps, rank_grads(t, 0, SHAPES))
        opt.step()
        sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
    assert lrs[-1] == [0.0, 0.0] and lrs[1][0] == pytest.approx(0.005)
    assert lrs[0][1] == pytest.approx(0.1 * lrs[0][0])
    # the update uses each group's current lr: at lr 0 (decay lr * wd = 0 too) nothing moves
    before = flat(ps)
    set_grads(ps, rank_grads(9, 0, SHAPES))
    opt.step()
    assert torch.equal(flat(ps), before)


def test_stale_m_ablation_keeps_frozen_moments_and_sends_gradients():
    ps = make_params(SHAPES)
    opt = SCAPE(ps, sparsity=0.95, mask_rule="stale_m", bias_correction=False, **HP)
    set_grads(ps, rank_grads(0, 0, SHAPES))
    opt.step()
    assert opt.last_step_info["sparsity"] == 0.0    # no ranking yet: a dense first step
    for t in range(1, 4):
        g = flat(rank_grads(t, 0, SHAPES))
        m_before, r_before = opt.m.clone(), opt.residual.clone()
        expect = torch.zeros(opt.n, dtype=torch.bool)     # top-k of the frozen |m|, 1-D whole
        off = 0
        for s in SHAPES:
            n = math.prod(s)
            k = n if len(s) == 1 else keep_count(0.05, n)
            expect[off + torch.topk(m_before[off:off + n].abs(), k).indices] = True
            off += n
        set_grads(ps, rank_grads(t, 0, SHAPES))
        opt.step()
        sent = opt.residual == 0
        assert torch.equal(sent, expect)
        assert torch.equal(opt.m[~sent], m_before[~sent])                 # frozen off the mask
        a = g + r_before                                                  # gradient units
        assert torch.allclose(opt.residual[~sent], a[~sent])
        assert torch.allclose(opt.m[sent], 0.9 * m_before[sent] + 0.1 * a[sent], atol=1e-6)


def test_state_dict_roundtrip_continues_bit_identically():
    ps, qs = make_params(SHAPES), make_params(SHAPES)
    a = SCAPE(grouped(ps), sparsity=0.9, max_grad_norm=1.0, betas=BETAS, eps=EPS)
    for t in range(3):
        set_grads(ps, rank_grads(t, 0, SHAPES))
        a.step()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    b = SCAPE(grouped(qs), sparsity=0.9, max_grad_norm=1.0, betas=BETAS, eps=EPS)
    with torch.no_grad():
        for p, q in zip(ps, qs):
            q.copy_(p)
    b.load_state_dict(state)
    for t in range(3, 7):
        g = rank_grads(t, 0, SHAPES)
        set_grads(ps, g)
        set_grads(qs, g)
        a.step()
        b.step()
        assert torch.equal(flat(ps), flat(qs))
    assert torch.equal(a.residual, b.residual) and a.coverage() == b.coverage()
    with pytest.raises(ParameterError, match="mask_rule"):
        SCAPE(grouped(make_params(SHAPES)), sparsity=0.9,
              mask_rule="stale_m").load_state_dict(state)


def test_non_finite_gradient_names_the_parameter_and_changes_nothing():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = SCAPE(model.named_parameters(), sparsity=0.5, **HP)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v
             for k, v in opt.state_dict().items()}
    params = [p.detach().clone() for p in model.parameters()]
    model.zero_grad()
    model(torch.randn(5, 3)).sum().backward()
    model[1].weight.grad[0, 1] = float("nan")
    with pytest.raises(NonFiniteGradientError, match=r"1\.weight.*grad = nan.*must be finite"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    after = opt.state_dict()
    assert torch.equal(after["m"], state["m"]) and torch.equal(after["residual"],
                                                              state["residual"])
    assert torch.equal(after["next_mask"], state["next_mask"]) and after["step"] == 1
    model[1].weight.grad.nan_to_num_(0.0)
    opt.step()                                      # the retry uses the same mask
    assert opt.num_steps == 2


def test_bf16_parameters_keep_an_fp32_master():
    ps = [p.detach().to(torch.bfloat16).requires_grad_(True) for p in make_params(SHAPES)]
    opt = SCAPE(ps, sparsity=0.9, **HP)
    for t in range(3):
        set_grads(ps, [g.to(torch.bfloat16) for g in rank_grads(t, 0, SHAPES)])
        opt.step()
    assert opt.master.dtype == torch.float32
    assert torch.equal(flat(ps), opt.master.to(torch.bfloat16))


# ----------------------------------------------------------------------------------------------
# several processes (gloo)
# ----------------------------------------------------------------------------------------------
def _gloo_worker(rank: int, world: int) -> dict:
    out: dict = {}
    # (a) sparsity 0, no bias correction == dense AdamS on the averaged gradient
    for bc in (False, True):
        ps, qs = make_params(SHAPES), make_params(SHAPES)
        opt = SCAPE(grouped(ps), sparsity=0.0, bias_correction=bc, betas=BETAS, eps=EPS)
        ref = AdamS(grouped(qs), betas=BETAS, eps=EPS, bias_correction=bc)
        for t in range(4):
            set_grads(ps, rank_grads(t, rank, SHAPES))
            set_grads(qs, [sum(rank_grads(t, r, SHAPES)[i] for r in range(world)) / world
                           for i in range(len(SHAPES))])
            opt.step()
            ref.step()
            assert (flat(ps) - flat(qs)).abs().max() <= (5e-6 if bc else 1e-6), (bc, t)
    # (b) the plain simulation of every worker, at two densities, with the schedule, groups,
    # clipping and bias correction; replicas bit-identical; bytes as predicted
    for density in (0.1, 0.02):
        ps = make_params(SHAPES)
        order = flat_order(ps)
        sim = ReferenceSCAPE(flat(order), [p.shape for p in order], sorted(GROUPS),
                             [(0.01, 0.1), (0.02, 0.0)], world, density, BETAS, EPS,
                             dense_steps=1, density_start=0.5, warmup=2, max_grad_norm=3.0)
        opt = SCAPE(grouped(ps), sparsity=1 - density, dense_steps=1, sparsity_start=0.5,
                    sparsity_warmup_steps=2, max_grad_norm=3.0, betas=BETAS, eps=EPS)
        for t in range(7):
            set_grads(ps, rank_grads(t, rank, SHAPES))
            opt.step()
            used = sim.step([flat(flat_order(rank_grads(t, r, SHAPES))) for r in range(world)])
            mine = opt.master.clone()
            # the same masks exactly; the numbers to fp32 rounding (the simulation writes
            # p - lr (u + wd p), the optimizer p (1 - lr wd) - lr u: about an ulp per step)
            assert torch.allclose(mine, sim.params, rtol=1e-6, atol=1e-6), (density, t)
            assert (opt.residual - sim.r[rank]).abs().max() <= 1e-6, (density, t)
            assert torch.equal(opt.m != 0, sim.m != 0) and torch.equal(opt.m != 0, used)
            others = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(others, mine)
            assert all(torch.equal(o, mine) for o in others), (density, t)
            if t >= 3:                              # steady state: the analytic byte count
                assert opt.comm_stats() == opt.expected_bytes(t), (density, t)
        out[density] = opt.mask_encoding(1 - density)[0]
    # (c) the ablation runs distributed with identical replicas too
    ps = make_params(SHAPES)
    opt = SCAPE(ps, sparsity=0.95, mask_rule="stale_m", **HP)
    for t in range(4):
        set_grads(ps, rank_grads(t, rank, SHAPES))
        opt.step()
    mine = flat(ps)
    others = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(others, mine)
    assert all(torch.equal(o, mine) for o in others)
    # (d) a non-finite gradient on the last rank only: every rank raises, nobody hangs
    ps = make_params(SHAPES)
    opt = SCAPE(ps, sparsity=0.9, **HP)
    set_grads(ps, rank_grads(0, rank, SHAPES))
    opt.step()
    before = flat(ps)
    g = rank_grads(1, rank, SHAPES)
    if rank == world - 1:
        g[3][2, 2] = float("inf")
    set_grads(ps, g)
    try:
        opt.step()
        out["nonfinite"] = "no error"
    except NonFiniteGradientError as err:
        out["nonfinite"] = str(err)
    assert torch.equal(flat(ps), before)
    # (e) mismatched parameter sizes across ranks -> ParameterError on every rank
    try:
        SCAPE(make_params([(10 + rank,)]), sparsity=0.5)
    except ParameterError as err:
        out["mismatch"] = str(err)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_gloo_workers_match_the_simulation(world):
    res = run_workers(_gloo_worker, world)
    for r in range(world):
        assert res[r][0.1] == "bitmap" and res[r][0.02] == "index"
        assert "identical on every rank" in res[r]["mismatch"]
        assert "must be finite" in res[r]["nonfinite"]
    assert "params[3]" in res[world - 1]["nonfinite"] and "= inf" in res[world - 1]["nonfinite"]
    assert "1 other rank" in res[0]["nonfinite"]


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan"), "0.9", True])
def test_bad_sparsity(bad):
    with pytest.raises(ParameterError, match=r"SCAPE\.sparsity = .*\[0, 1\)"):
        SCAPE(make_params(SHAPES), sparsity=bad)


@pytest.mark.parametrize("kw,match", [
    ({"sparsity_warmup_steps": -1}, r"sparsity_warmup_steps = -1: must be an integer >= 0"),
    ({"dense_steps": 2.5}, r"dense_steps = 2.5"),
    ({"sparsity_start": 1.0}, r"sparsity_start = 1.0"),
    ({"max_grad_norm": 0.0}, r"max_grad_norm = 0.0: must be None"),
    ({"max_grad_norm": float("inf")}, r"max_grad_norm = inf"),
    ({"mask_rule": "m_abs"}, r"mask_rule = 'm_abs': must be one of"),
    ({"bias_correction": 1}, r"bias_correction = 1: must be True or False"),
    ({"off_mask_momentum": "keep"}, r"off_mask_momentum = 'keep': must be one of"),
    ({"off_mask_momentum": "decay", "mask_rule": "stale_m"},
     r"off_mask_momentum = 'decay': 'decay' needs mask_rule='ef_momentum'"),
    ({"off_mask_momentum": "decay", "decay_scope": "mask"},
     r"off_mask_momentum = 'decay': .*\(got 'ef_momentum', 'mask'\)"),
    ({"lr": -1.0}, r"SCAPE\.lr = -1.0"),
])
def test_bad_options(kw, match):
    with pytest.raises(ParameterError, match=match):
        SCAPE(make_params(SHAPES), sparsity=0.9, **kw)


def test_bad_parameter_groups():
    ps = make_params(SHAPES)
    with pytest.raises(ParameterError, match=r"params\[1\] = .*'params' entry"):
        SCAPE([{"params": ps[:2]}, {"lr": 0.1}], sparsity=0.9)
    with pytest.raises(ParameterError, match=r"params\[0\]\.weight_decay = -1"):
        SCAPE([{"params": ps, "weight_decay": -1}], sparsity=0.9)
    with pytest.raises(ParameterError, match=r"params\[0\]\.betas.*only lr and weight_decay"):
        SCAPE([{"params": ps, "betas": (0.5, 0.5)}], sparsity=0.9)
    with pytest.raises(ParameterError, match=r"unknown parameter-group keys"):
        SCAPE([{"params": ps, "momentum": 0.9}], sparsity=0.9)
    with pytest.raises(ParameterError, match="listed twice"):
        SCAPE([{"params": ps}, {"params": ps[:1]}], sparsity=0.9)
    with pytest.raises(ParameterError, match=r"params\[0\]\.params.*at least one"):
        SCAPE([{"params": []}], sparsity=0.9)
    opt = SCAPE(ps, sparsity=0.9)
    with pytest.raises(ParameterError, match="add_param_group"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})


def test_missing_grad_and_mixed_devices_and_group():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = SCAPE(model.named_parameters(), sparsity=0.5)
    model[0](torch.randn(2, 3)).sum().backward()        # second layer gets no gradient
    with pytest.raises(ParameterError, match=r"1\.weight.*grad.*loss\.backward"):
        opt.step()
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, device="meta", requires_grad=True)
    with pytest.raises(ParameterError, match="one device"):
        SCAPE([a, b], sparsity=0.9)
    with pytest.raises(ParameterError, match="process_group"):
        SCAPE(make_params(SHAPES), sparsity=0.9, process_group=object())


# ----------------------------------------------------------------------------------------------
# the decay-scope ablation and the mask diagnostics
# ----------------------------------------------------------------------------------------------

def test_decay_scope_mask_decays_only_the_coordinates_of_the_step():
    """decay_scope="mask" (an ablation): a coordinate off the mask keeps its value exactly
    (no gradient step and no decay), one on it moves; the default decays every coordinate."""
    ps = make_params(SHAPES)
    opt = SCAPE(grouped(ps), sparsity=0.95, decay_scope="mask", **HP)
    base = make_params(SHAPES)
    dflt = SCAPE(grouped(base), sparsity=0.95, **HP)
    for t in range(3):
        before = opt.master.clone()
        set_grads(ps, rank_grads(t, 0, SHAPES))
        set_grads(base, rank_grads(t, 0, SHAPES))
        opt.step()
        dflt.step()
        moved = opt.master != before
        on = torch.zeros_like(moved)
        on[opt._support] = True
        lo, hi = opt.group_bounds[0]           # the decayed group
        assert not moved[lo:hi][~on[lo:hi]].any()
        assert moved[lo:hi][on[lo:hi]].float().mean() > 0.9
    lo, hi = dflt.group_bounds[0]
    assert (dflt.master[lo:hi] != opt.master[lo:hi]).float().mean() > 0.5
    with pytest.raises(ParameterError, match=r"SCAPE\.decay_scope = 'some'"):
        SCAPE(make_params(SHAPES), sparsity=0.9, decay_scope="some")


def test_mask_diagnostics_describe_consecutive_masks():
    """mask_kept is |M_t & M_t-1| / |M_t| over the top-k tensors; step_enter / step_stay are the
    mean |u| of the coordinates entering / staying, read back from the step itself; a coordinate
    re-entering with m_prev = 0 steps by about (1 - b1) / sqrt(1 - b2) before bias correction."""
    ps = make_params(SHAPES)
    opt = SCAPE(grouped(ps), sparsity=0.95, bias_correction=False, **HP)
    top = torch.zeros(opt.n, dtype=torch.bool)
    for s in opt.slots:
        if not s.excluded:
            top[s.offset:s.offset + s.numel] = True
    prev = None
    for t in range(6):
        set_grads(ps, rank_grads(t, 0, SHAPES))
        before = opt.master.clone()
        opt.step()
        cur = torch.zeros(opt.n, dtype=torch.bool)
        cur[opt._support] = True
        cur &= top
        info = opt.last_step_info
        if prev is not None:
            kept = (cur & prev).sum().item() / cur.sum().item()
            assert info["mask_kept"] == pytest.approx(kept, abs=1e-6)
            step = (before - opt.master).abs() / 0.01   # |u| (+ decay, small), lr = 0.01
            enter = cur & ~prev
            if enter.any():
                assert info["step_enter"] == pytest.approx(step[enter].mean().item(), rel=0.05)
                b1, b2 = BETAS
                assert info["step_enter"] <= (1 - b1) / math.sqrt(1 - b2) * 1.01
        prev = cur


# ----------------------------------------------------------------------------------------------
# the momentum off the mask (off_mask_momentum) and the diagnostics that carry information
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["zero", "decay"])
def test_off_mask_momentum_rules(rule):
    """Both rules keep m + r = b1 m_prev + (1 - b1) g + r_prev on every coordinate (world 1, no
    clipping) and r = 0 on the mask. "zero" (the authors'): m = 0 off the mask, which does not
    move (no weight decay here). "decay": m = b1 m_prev off the mask, the residual gains only
    (1 - b1) g there, and the coordinate steps by lr b1 m bc1 / (sqrt(b2) |m| bc2 + eps); the
    share of sum |u| off the mask is recorded as off_mask_mass."""
    b1, b2 = BETAS
    lr = 0.01
    ps = make_params(SHAPES)
    opt = SCAPE(grouped(ps, lrs=(lr, lr), wds=(0.0, 0.0)), sparsity=0.95, betas=BETAS, eps=EPS,
                off_mask_momentum=rule)
    masses = []
    for t in range(6):
        g = flat(flat_order(rank_grads(t, 0, SHAPES)))
        set_grads(ps, rank_grads(t, 0, SHAPES))
        m_prev, r_prev, before = opt.m.clone(), opt.residual.clone(), opt.master.clone()
        opt.step()
        on = opt.last_in == t
        off = ~on
        assert torch.allclose(opt.m + opt.residual, b1 * m_prev + (1 - b1) * g + r_prev,
                              atol=1e-6), t
        assert not opt.residual[on].any()
        moved = before - opt.master
        mass = opt.last_step_info["off_mask_mass"]
        if rule == "zero":
            assert not opt.m[off].any() and not moved[off].any() and mass == 0.0
            continue
        assert torch.equal(opt.m[off], m_prev[off] * b1)
        assert torch.allclose(opt.residual[off], r_prev[off] + (1 - b1) * g[off], atol=1e-7)
        bc1, bc2 = 1 / (1 - b1 ** (t + 1)), 1 / math.sqrt(1 - b2 ** (t + 1))
        u = b1 * m_prev * bc1 / (math.sqrt(b2) * m_prev.abs() * bc2 + EPS)
        assert torch.allclose(moved[off], lr * u[off], rtol=1e-3, atol=1e-6), t
        expect = (moved[off].double().abs().sum() / moved.double().abs().sum()).item()
        assert mass == pytest.approx(expect, rel=1e-3, abs=1e-9)
        masses.append(mass)
    if rule == "decay":
        # step 0 bootstraps M_0 from c_0 and M_1 ranks c_0 too: momentum off the mask from t = 1
        assert masses[0] == 0.0 and min(masses[2:]) > 0.3


def test_off_mask_decay_state_roundtrip_and_refusal():
    ps, qs = make_params(SHAPES), make_params(SHAPES)
    a = SCAPE(grouped(ps), sparsity=0.9, off_mask_momentum="decay", betas=BETAS, eps=EPS)
    for t in range(3):
        set_grads(ps, rank_grads(t, 0, SHAPES))
        a.step()
    state = a.state_dict()
    b = SCAPE(grouped(qs), sparsity=0.9, off_mask_momentum="decay", betas=BETAS, eps=EPS)
    with torch.no_grad():
        for p, q in zip(ps, qs):
            q.copy_(p)
    b.load_state_dict(state)
    for t in range(3, 6):
        g = rank_grads(t, 0, SHAPES)
        set_grads(ps, g)
        set_grads(qs, g)
        a.step()
        b.step()
        assert torch.equal(flat(ps), flat(qs)) and torch.equal(a.m, b.m)
    with pytest.raises(ParameterError, match=r"state_dict\['off_mask_momentum'\] = 'decay'"):
        SCAPE(grouped(make_params(SHAPES)), sparsity=0.9).load_state_dict(state)


def test_recent_fraction_and_off_mask_mass_on_constructed_cases():
    from lmrepro.optim.scape_layout import off_mask_direction, off_mask_mass, recent_fraction

    # the last step each coordinate was in the mask; the last two are sent whole (step 150)
    last_in = torch.tensor([-1, 0, 5, 99, 100, 150, 150])
    assert recent_fraction(last_in, 150, n_excluded=2) == pytest.approx(2 / 5)    # 100, 150
    assert recent_fraction(last_in, 150, 2, window=200) == pytest.approx(4 / 5)
    assert recent_fraction(last_in, 150, 2, window=1) == 0.0
    on = torch.tensor([True, False, False])
    assert off_mask_mass(torch.tensor([3.0, 4.0, 1.0]), on) == pytest.approx(5 / 8)
    assert off_mask_mass(torch.tensor([3.0, 0.0, 0.0]), on) == 0.0
    assert off_mask_mass(torch.zeros(3), on) is None
    # a coordinate that left the mask keeps a step of about b1 / sqrt(b2) in sign(m)
    u = off_mask_direction(torch.tensor([1e-3, -2e-2, 0.0]), 0.9, 0.95, 1e-8, 1.0, 1.0)
    assert u[:2].tolist() == pytest.approx([0.9 / math.sqrt(0.95), -0.9 / math.sqrt(0.95)],
                                           rel=1e-4)
    assert u[2] == 0.0


def test_recent_coverage_is_the_union_of_the_last_100_masks():
    """Per step, recent_coverage is |union of M_s, s in (t - 100, t]| over the top-k tensors'
    coordinates: equal to coverage() (ever selected) up to step 99, below it after."""
    ps = make_params(SHAPES)
    opt = SCAPE(ps, sparsity=0.99, **HP)
    top = torch.zeros(opt.n, dtype=torch.bool)
    for sl in opt.slots:
        if not sl.excluded:
            top[sl.offset:sl.offset + sl.numel] = True
    masks = []
    for t in range(130):
        set_grads(ps, rank_grads(t % 7, 0, SHAPES))
        opt.step()
        masks.append((opt.last_in == t) & top)
        union = torch.stack(masks[-100:]).any(0)
        got = opt.last_step_info["recent_coverage"]
        assert got == pytest.approx(union.sum().item() / top.sum().item()), t
        if t < 100:
            assert got == pytest.approx(opt.coverage())
    assert got < opt.coverage()
