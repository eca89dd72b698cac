"""The one global-backprop trainer (lmrepro.backprop): its step, its checkpoint layout, and that
both global-backprop callers (the baseline stage, RGC's backprop executor) go through it."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from lmrepro import backprop
from lmrepro.backprop import backprop_step
from lmrepro.baseline.config import BaselineConfig
from lmrepro.baseline.trainer import train_single
from lmrepro.checkpoints import ALL, restore_single_model, single_model_state
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.rgc import RGCConfig, train

from _runs import latest_checkpoint, load_checkpoint

CFG = ModelConfig(n_layers=2, d_model=16, n_heads=2, context=16)


def batch(n: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.randint(0, 256, (n, CFG.context + 1), generator=g)
    return xy[:, :-1], xy[:, 1:]


def model_and_sgd(seed: int = 0) -> tuple[ByteTransformer, torch.optim.SGD]:
    torch.manual_seed(seed)
    m = ByteTransformer(CFG)
    return m, torch.optim.SGD(m.parameters(), lr=0.5)


def grad_norm(model: torch.nn.Module) -> float:
    return float(torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(p.grad) for p in model.parameters() if p.grad is not None])))


@pytest.mark.parametrize("parts", [2, 4])
def test_micro_batches_give_the_full_batch_step(parts: int) -> None:
    x, y = batch()
    full, opt_full = model_and_sgd()
    micro, opt_micro = model_and_sgd()
    with torch.no_grad():
        expected = float(lm_loss(full(x), y))
    loss_full = backprop_step(full, full, opt_full, x, y)
    loss_micro = backprop_step(micro, micro, opt_micro, x, y, micro_batches=parts)
    # equal micro-batches: the mean of their mean losses is the full batch's mean loss
    assert loss_full == pytest.approx(expected, rel=1e-6)
    assert loss_micro == pytest.approx(loss_full, rel=1e-5)
    for (n, a), b in zip(full.named_parameters(), micro.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), n
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), n
    untouched = model_and_sgd()[0]
    assert not all(torch.equal(a, b) for a, b in zip(full.parameters(), untouched.parameters()))


def test_clip_bounds_the_global_gradient_norm() -> None:
    x, y = batch()
    free, opt_free = model_and_sgd()
    clipped, opt_clipped = model_and_sgd()
    before = dict((n, p.detach().clone()) for n, p in clipped.named_parameters())
    backprop_step(free, free, opt_free, x, y, max_grad_norm=0.0)
    raw = grad_norm(free)
    limit = raw / 10
    backprop_step(clipped, clipped, opt_clipped, x, y, max_grad_norm=limit)
    assert grad_norm(clipped) == pytest.approx(limit, rel=1e-4)
    # SGD: the update is lr times the clipped gradient, a tenth of the unclipped one
    moved = torch.linalg.vector_norm(torch.cat(
        [(p.detach() - before[n]).flatten() for n, p in clipped.named_parameters()]))
    assert float(moved) == pytest.approx(0.5 * limit, rel=1e-3)
    # a limit above the norm changes nothing
    loose, opt_loose = model_and_sgd()
    backprop_step(loose, loose, opt_loose, x, y, max_grad_norm=raw * 2)
    for a, b in zip(free.parameters(), loose.parameters()):
        assert torch.equal(a, b)


def test_checkpoint_layout_round_trip_and_the_old_baseline_layout() -> None:
    model, opt = model_and_sgd()
    x, y = batch()
    backprop_step(model, model, opt, x, y)
    gen = torch.Generator().manual_seed(7)
    torch.randint(0, 9, (5,), generator=gen)
    new = single_model_state(copy.deepcopy(model.state_dict()), {ALL: copy.deepcopy(
        opt.state_dict())}, gen.get_state(), extra=[1])
    assert set(new) == {"model", "optims", "gen_state", "extra"}
    old = {"model": new["model"], "optimizer": new["optims"][ALL], "generator": new["gen_state"]}
    for ck in (new, old):
        m2, o2 = model_and_sgd(seed=1)
        g2 = torch.Generator().manual_seed(0)
        restore_single_model(ck, m2, {ALL: o2}, g2)
        for a, b in zip(model.parameters(), m2.parameters()):
            assert torch.equal(a, b)
        assert o2.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
        assert torch.equal(g2.get_state(), gen.get_state())


@pytest.fixture
def counted_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every call of the shared step, by its micro-batch count."""
    calls: list[int] = []
    real = backprop.backprop_step

    def counting(*args: Any, **kw: Any) -> float:
        calls.append(args[5] if len(args) > 5 else kw.get("micro_batches", 1))
        return real(*args, **kw)

    monkeypatch.setattr(backprop, "backprop_step", counting)
    return calls


def test_both_global_backprop_callers_go_through_it(counted_steps: list[int], tmp_path,
                                                    text_bytes: np.ndarray) -> None:
    settings = BaselineConfig(steps=3, batch_size=4, lr=3e-3, warmup_steps=1, eval_every=2,
                              eval_batches=2, eval_batch_size=4, checkpoint_every=2,
                              log_every=1, threads=1)
    train_single(CFG, settings, text_bytes[:50000], text_bytes[50000:], tmp_path / "b", seed=1,
                 progress=False)
    assert counted_steps == [1, 1, 1]
    ck = load_checkpoint(tmp_path / "b", latest_checkpoint(tmp_path / "b")["identity"])
    assert set(ck["optims"]) == {ALL}            # the shared layout
    counted_steps.clear()
    rgc = RGCConfig(model=ModelConfig(n_layers=2, d_model=16, n_heads=2, context=16),
                    n_stages=2, horizon=1, steps=3, batch_size=4, micro_batches=2,
                    warmup_steps=1, lr=3e-3, eval_batch_size=4, eval_batches=2, threads=(1, 1),
                    backprop_threads=1)
    r = train(rgc, "backprop", text_bytes[:50000], text_bytes[50000:])
    assert counted_steps == [2, 2, 2]
    assert [m["stage_losses"] for m in r.metrics if "loss" in m] == \
        [[m["loss"]] for m in r.metrics if "loss" in m]
    counted_steps.clear()
    train(rgc, "sync", text_bytes[:50000], text_bytes[50000:])
    assert counted_steps == []                   # RGC keeps its own step
