"""AdamS (arXiv 2505.16363) against the formula of arXiv 2505.16363, written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lmrepro.errors import ParameterError
from lmrepro.optim import AdamS


def _formula(p, g, m_prev, lr, b1, b2, eps, wd):
    """Scalar AdamS, one coordinate at a time (float64 Python math)."""
    m = b1 * m_prev + (1 - b1) * g
    v = b2 * m_prev ** 2 + (1 - b2) * g ** 2
    return p - lr * (m / (math.sqrt(v) + eps) + wd * p), m


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_matches_scalar_formula(wd):
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-8
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    opt = AdamS([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    ref_p = p.detach().reshape(-1).tolist()
    ref_m = [0.0] * len(ref_p)
    for _ in range(5):
        g = torch.randn(4, 3, generator=gen, dtype=torch.float64)
        p.grad = g.clone()
        opt.step()
        for i, gi in enumerate(g.reshape(-1).tolist()):
            ref_p[i], ref_m[i] = _formula(ref_p[i], gi, ref_m[i], lr, b1, b2, eps, wd)
        assert torch.allclose(p.detach().reshape(-1), torch.tensor(ref_p, dtype=torch.float64),
                              atol=1e-12, rtol=0)
        assert torch.allclose(opt.state[p]["m"].reshape(-1),
                              torch.tensor(ref_m, dtype=torch.float64), atol=1e-12, rtol=0)


def test_first_step_has_no_bias_correction():
    p = torch.zeros(3, requires_grad=True)
    opt = AdamS([p], lr=1.0, betas=(0.9, 0.999), eps=0.0 + 1e-12)
    p.grad = torch.tensor([2.0, -0.5, 1e-3])
    opt.step()
    # m_1 = 0.1 g, v_1 = 0.001 g^2  =>  step = 0.1/sqrt(0.001) sign(g) = 3.1623 sign(g)
    expect = -0.1 / math.sqrt(0.001) * torch.sign(p.grad)
    assert torch.allclose(p.detach(), expect, atol=1e-5)


def test_v_uses_previous_m_not_current():
    p = torch.zeros(1, requires_grad=True)
    opt = AdamS([p], lr=1.0, betas=(0.5, 0.5), eps=1e-12)
    p.grad = torch.tensor([1.0])
    opt.step()                                  # m1 = 0.5, p1 = -0.5/sqrt(0.5)
    p1 = p.item()
    p.grad = torch.tensor([3.0])
    opt.step()                                  # m2 = 0.25+1.5 = 1.75, v2 = 0.5*0.25 + 0.5*9
    expect = p1 - 1.75 / math.sqrt(0.5 * 0.25 + 0.5 * 9.0)
    assert p.item() == pytest.approx(expect, abs=1e-6)


def test_weight_decay_is_decoupled():
    p = torch.full((2,), 2.0, requires_grad=True)
    opt = AdamS([p], lr=0.1, weight_decay=0.5)
    p.grad = torch.zeros(2)                     # zero gradient: only decay acts (m=v=0 -> 0)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((2,), 2.0 - 0.1 * 0.5 * 2.0))


def test_single_state_buffer_and_skips_none_grads():
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    opt = AdamS([a, b])
    a.grad = torch.ones(3)
    before = b.detach().clone()
    opt.step()
    assert set(opt.state[a]) == {"m", "step"}
    assert b not in opt.state and torch.equal(b.detach(), before)


@pytest.mark.parametrize("kw,name", [({"lr": -1.0}, "lr"), ({"betas": (1.0, 0.9)}, "betas"),
                                     ({"eps": 0.0}, "eps"), ({"weight_decay": -0.1},
                                                             "weight_decay")])
def test_bad_hyperparameters(kw, name):
    with pytest.raises(ParameterError, match=name):
        AdamS([torch.zeros(1, requires_grad=True)], **kw)


def test_bias_correction_divides_like_adam():
    """bias_correction=True: m / (1 - b1^t) over sqrt(v / (1 - b2^t)) + eps, t the step count
    (the AdamS of the SCAPE authors' runs)."""
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-8
    gen = torch.Generator().manual_seed(1)
    p = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    opt = AdamS([p], lr=lr, betas=(b1, b2), eps=eps, bias_correction=True)
    ref_p, ref_m = p.detach().tolist(), [0.0] * 6
    for t in range(1, 5):
        g = torch.randn(6, generator=gen, dtype=torch.float64)
        p.grad = g.clone()
        opt.step()
        for i, gi in enumerate(g.tolist()):
            m = b1 * ref_m[i] + (1 - b1) * gi
            v = b2 * ref_m[i] ** 2 + (1 - b2) * gi ** 2
            ref_p[i] -= lr * (m / (1 - b1 ** t)) / (math.sqrt(v / (1 - b2 ** t)) + eps)
            ref_m[i] = m
        assert torch.allclose(p.detach(), torch.tensor(ref_p, dtype=torch.float64), atol=1e-12)
    with pytest.raises(ParameterError, match="bias_correction"):
        AdamS([p], bias_correction="yes")
