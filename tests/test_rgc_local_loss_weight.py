"""RGC's weighted local losses (``rgc.local_loss_weight`` lambda; docs/rgc.md, "Weighted local
losses"): lambda = 0 at H = K trains what global backprop trains, lambda = 1 is RGC as before,
the setting is validated, recorded only when it is not 1, and set per run by the length study."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmrepro.errors import ConfigError
from lmrepro.rgc import RGCConfig, train
from lmrepro.rgc.core import stages
from lmrepro.rgc.core.recipe import build_model
from lmrepro.rgc.core.stages import accumulate_rgc_grads, stage_bounds

torch.set_num_threads(1)

TEXT = (b"The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. ") * 80
DATA = np.frombuffer(TEXT, dtype=np.uint8).copy()
TRAIN, VAL = DATA[:5000], DATA[5000:]


def wide(**kw) -> RGCConfig:
    """4 stages of one d = 64 block at H = K, 6 steps. AdamW's first step is lr x sign(g) and
    every later one is invariant to a constant factor on a tensor's gradient but for ``eps``:
    with ``eps`` near the gradients' own size (1e-4 here; they are ~1e-5 to 1e-2) a tensor whose
    gradient is off by a factor moves differently, so a scale error cannot hide (checked below
    with the decoder's consensus divided by K instead of by the weights' sum)."""
    base = dict(model=dict(n_layers=4, d_model=64, n_heads=2, context=32), n_stages=4,
                horizon=4, steps=6, batch_size=8, micro_batches=2, warmup_steps=1, lr=3e-3,
                eps=1e-4, eval_batch_size=4, eval_batches=2, checkpoint_every=100,
                backprop_threads=1, threads=[1, 1], stages_per_worker=[2, 2])
    base.update(kw)
    return RGCConfig(**base)


def beyond_rounding(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, int]:
    """Per tensor, the coordinates of ``a`` that differ from ``b`` by more than float rounding
    after a few steps (rtol 1e-4, atol 1e-5); tensors with none left out."""
    out = {}
    for n, v in b.items():
        k = int(((a[n] - v).abs() > 1e-5 + 1e-4 * v.abs()).sum())
        if k:
            out[n] = k
    return out


@pytest.fixture(scope="module")
def backprop() -> dict[str, torch.Tensor]:
    return train(wide(), "backprop", TRAIN, VAL).final_state


def test_lambda_zero_at_full_horizon_is_global_backprop(backprop) -> None:
    """Only the model's own loss trains: every weight after 6 steps (the decoder's included,
    whose consensus is then the last stage's readout gradient alone) within rounding of the
    package's global-backprop trainer; the intermediate readouts are still measured and
    logged."""
    r = train(wide(local_loss_weight=0.0), "sync", TRAIN, VAL)
    assert beyond_rounding(r.final_state, backprop) == {}
    losses = [m["stage_losses"] for m in r.metrics if "loss" in m]
    assert len(losses) == 6 and all(len(v) == 4 and np.isfinite(v).all() for v in losses)


def test_the_comparison_would_catch_a_weight_or_a_scale_error(
        backprop, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the test above would miss if the model were too small or AdamW too forgiving: a
    weight of 0.5 instead of 0 moves most coordinates of the early stages, and a consensus
    divided by K (the plain mean, the decoder's gradient 1/K of backprop's) moves the decoder."""
    half = train(wide(local_loss_weight=0.5), "sync", TRAIN, VAL).final_state
    off = beyond_rounding(half, backprop)
    assert off.get("blocks.0.attn.qkv.weight", 0) > 0.5 * backprop["blocks.0.attn.qkv.weight"] \
        .numel(), off
    mean = stages.consensus_decoder_grad
    monkeypatch.setattr(stages, "consensus_decoder_grad",
                        lambda grads, divisor=None: mean(grads))   # always / K
    scaled = train(wide(local_loss_weight=0.0), "sync", TRAIN, VAL).final_state
    off = beyond_rounding(scaled, backprop)
    assert off.get("decoder.head.weight", 0) > 0.1 * backprop["decoder.head.weight"].numel(), off


def test_lambda_one_is_rgc_as_before_and_keeps_every_identity() -> None:
    """lambda = 1 takes the unweighted path (bit for bit, the plain mean of the readout
    gradients) and is left out of the configuration's record, so the runs trained before the
    setting existed keep their identities; any other value is recorded."""
    c = wide(steps=2)
    assert c.to_dict() == wide(steps=2, local_loss_weight=1.0).to_dict()
    assert "local_loss_weight" not in c.to_dict()
    assert wide(local_loss_weight=0.3).to_dict()["local_loss_weight"] == 0.3
    assert (c.loss_weights, c.consensus_divisor) == ([1.0] * 4, 4.0)
    bounds = stage_bounds(c.model.n_layers, c.n_stages)
    x = torch.from_numpy(TRAIN[:8 * 33].astype(np.int64)).view(8, 33)
    grads = []
    for weights in (None, c.loss_weights):
        model = build_model(c, 0)
        accumulate_rgc_grads(model, bounds, x[:, :-1], x[:, 1:], c.horizon, 0.5, weights)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        assert torch.equal(grads[1][n], g), n
    # the weighted formula itself, forced at lambda = 1 (sum / 4), is the mean to rounding
    per_stage = [torch.randn(5, 7) for _ in range(4)]
    torch.testing.assert_close(stages.consensus_decoder_grad(per_stage, 4.0),
                               stages.consensus_decoder_grad(per_stage))


def test_the_weighted_consensus_is_the_weighted_mean_of_the_readout_gradients() -> None:
    """The decoder's gradient at lambda: ``sum_k w_k dL_k/dD / sum_k w_k`` with w = (lambda,
    ..., 1), computed here from each stage's unweighted readout gradient."""
    c = wide(local_loss_weight=0.3)
    bounds = stage_bounds(c.model.n_layers, c.n_stages)
    x = torch.from_numpy(TRAIN[:8 * 33].astype(np.int64)).view(8, 33)
    xm, ym = x[:, :-1], x[:, 1:]
    model = build_model(c, 0)
    plain = stages.stage_local_grads(model, bounds, xm, ym, c.horizon)
    accumulate_rgc_grads(model, bounds, xm, ym, c.horizon, 1.0, c.loss_weights)
    w = [0.3, 0.3, 0.3, 1.0]
    for i, p in enumerate(stages.decoder_parameters(model)):
        want = sum(wk * lg.decoder[i] for wk, lg in zip(w, plain)) / sum(w)
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-8)
    # stage 0's blocks: every loss's gradient, the intermediate ones weighted
    name = next(n for n in plain[0].params if n.startswith("blocks.0."))
    want = sum(wk * lg.params[name] for wk, lg in zip(w, plain))
    torch.testing.assert_close(dict(model.named_parameters())[name].grad, want,
                               rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kw, needle", [
    (dict(local_loss_weight=-0.1), "greater than or equal to 0"),
    (dict(local_loss_weight=float("nan")), "finite"),
    (dict(local_loss_weight=float("inf")), "finite"),
    (dict(local_loss_weight=0.0, horizon=2), "0 needs horizon = n_stages"),
])
def test_a_bad_weight_is_a_one_line_error_naming_the_key(kw: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        wide(**kw)
    text = str(ei.value)
    assert "rgc.local_loss_weight" in text and needle in text and "\n" not in text.strip()


def test_the_setting_has_a_flag() -> None:
    import argparse

    from lmrepro.config import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser, RGCConfig)
    assert parser.parse_args(["--local-loss-weight", "0.3"]).local_loss_weight == 0.3
