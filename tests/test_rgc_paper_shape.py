"""The tensor-byte account of an RGC run (lmrepro.rgc.analysis.byte_account) against the real
model."""

from __future__ import annotations

import pytest
import torch

from lmrepro.model import lm_loss
from lmrepro.rgc.analysis import byte_account as ba
from lmrepro.rgc.core.recipe import build_model
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.core.stages import run_stage, stage_bounds, stage_parameters


def tiny(n_layers: int = 4, context: int = 16, **kw: object) -> RGCConfig:
    base = dict(model=dict(n_layers=n_layers, d_model=32, n_heads=4, context=context),
                n_stages=2, batch_size=8, micro_batches=2, steps=2, warmup_steps=1)
    return RGCConfig(**{**base, **kw})


def test_parameter_bytes_equal_the_models_tensors() -> None:
    cfg = tiny()
    model = build_model(cfg, 0)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert ba.FLOAT * ba.model_parameters(cfg) == total
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    for k in range(cfg.n_stages):
        params = stage_parameters(model, bounds, k)
        assert ba.stage_parameters(cfg, k) == sum(p.numel() for p in params)
        assert ba.stage_tensors(cfg, k) == len(params)
    assert ba.decoder_parameters(cfg) == sum(p.numel() for p in model.decoder.parameters())


@pytest.mark.parametrize("b,context", [(1, 16), (2, 16), (2, 32)])
def test_saved_activation_bytes_match_autograd(b: int, context: int) -> None:
    """The formula equals the storages autograd saves (parameters left out), per stage and for
    the readout, at several micro-batch sizes and contexts."""
    cfg = tiny(context=context)
    model = build_model(cfg, 0)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    x = torch.randint(0, 256, (b, context))
    params = list(model.parameters())
    got0, h = ba.measure_saved_bytes(lambda: run_stage(model, bounds, 0, x), params)
    assert got0 == ba.stage_saved_bytes(cfg, 0, b)
    leaf = h.detach().requires_grad_(True)
    got1, h1 = ba.measure_saved_bytes(lambda: run_stage(model, bounds, 1, leaf), params)
    assert got1 == ba.stage_saved_bytes(cfg, 1, b)
    r = h1.detach().requires_grad_(True)
    got_r, _ = ba.measure_saved_bytes(lambda: lm_loss(model.decoder(r), x), params)
    assert got_r == ba.readout_saved_bytes(cfg, b)


def test_activation_bytes_scale_linearly_with_micro_batch_and_context() -> None:
    cfg = tiny()
    one = ba.block_saved_bytes(cfg, 1)
    assert ba.block_saved_bytes(cfg, 4) == 4 * one
    assert ba.block_saved_bytes(tiny(context=64), 1) == 4 * one
    # the async executor keeps M micro-batches of a stage a gradient comes back to
    h1, h2 = ba.async_account(tiny(horizon=1)), ba.async_account(tiny(horizon=2))
    kept1 = h1["workers"][0]["bytes"]["activations_kept"]
    kept2 = h2["workers"][0]["bytes"]["activations_kept"]
    assert kept2 == tiny().micro_batches * kept1
    # the last stage never waits for a gradient
    assert h2["workers"][-1]["bytes"]["activations_kept"] == \
        h1["workers"][-1]["bytes"]["activations_kept"]


def test_running_ahead_keeps_a_graph_and_a_weight_snapshot_per_step_in_flight() -> None:
    """H = 2, s = 1 on four workers: worker w backpropagates step t - (3 - w) at step t, so it
    holds 4 - w steps of kept graphs and as many snapshots of its stage's weights; its queues
    hold (s + 1) x M messages."""
    cfg = tiny(n_stages=4, stages_per_worker=[1, 1, 1, 1], n_layers=4, horizon=2, steps=10)
    lock, ahead = ba.async_account(cfg), ba.async_account(cfg.replace(consensus_staleness=1))
    for w in range(3):
        b0, b1 = lock["workers"][w]["bytes"], ahead["workers"][w]["bytes"]
        assert b1["activations_kept"] == (4 - w) * b0["activations_kept"]
        assert b1["stashed_weights"] == (4 - w) * ba.FLOAT * ba.stage_parameters(cfg, w)
        assert b0["stashed_weights"] == 0
    assert ahead["workers"][3]["bytes"]["stashed_weights"] == 0
    assert ahead["workers"][0]["bytes"]["queued_copies"] == \
        2 * cfg.micro_batches * ba.activation_message_bytes(cfg)


def test_accounts_cover_every_kind_and_the_difference_sums() -> None:
    cfg = tiny(n_stages=4, stages_per_worker=[1, 1, 1, 1], n_layers=4)
    a, b = ba.async_account(cfg), ba.backprop_account(cfg)
    for w in a["workers"]:
        assert set(w["bytes"]) == set(ba.KINDS) and w["total"] == sum(w["bytes"].values())
    # the workers hold the model once between them (each its own stages) and a decoder
    # replica each
    assert sum(w["bytes"]["parameters"] for w in a["workers"]) + ba.FLOAT * \
        ba.decoder_parameters(cfg) == ba.FLOAT * ba.model_parameters(cfg)
    diff = dict(ba.dominant_difference(a, b))
    assert sum(diff.values()) == a["total"] - b["total"]
    # the backprop graph is every stage's graph plus one readout
    assert b["bytes"]["activations_kept"] == sum(ba.stage_saved_bytes(cfg, k) for k in range(4))


def test_saving_parts_to_files_keeps_the_snapshot_out_of_the_parent() -> None:
    """By file, the parent holds one part and the final clone; by bytes, every state and the
    clone of the assembled model: the difference is every part but the largest."""
    cfg = tiny(n_stages=4, stages_per_worker=[2, 2], n_layers=4)
    f, b = ba.async_account(cfg, via="file"), ba.async_account(cfg, via="bytes")
    parts = [w["bytes"]["snapshot"] for w in b["workers"]]
    assert all(w["bytes"]["snapshot"] == 0 for w in f["workers"])
    full = ba.FLOAT * ba.model_parameters(cfg)
    assert f["parent"]["bytes"]["snapshot"] == max(parts) + full
    assert b["parent"]["bytes"]["snapshot"] - f["parent"]["bytes"]["snapshot"] == \
        sum(parts) - max(parts)
    from lmrepro.errors import ParameterError

    with pytest.raises(ParameterError, match="via"):
        ba.async_account(cfg, via="pipe")


@pytest.mark.parametrize("spw, horizon, whole, per_hop", [
    ([2, 2], 2, [1, 1, 0, 0], [0, 1, 0, 0]),          # the benchmark's placement
    ([1, 1, 1, 1], 2, [3, 2, 1, 0], [1, 1, 1, 0]),    # the paper's: stage 0 3s against s
    ([1, 1, 1, 1], 3, [3, 2, 1, 0], [2, 2, 1, 0]),
    ([1, 1, 1, 1], 4, [3, 2, 1, 0], [3, 2, 1, 0]),    # H = K: every gradient crosses every hop
    ([1, 3], 2, [1, 0, 0, 0], [1, 0, 0, 0]),
])
def test_per_hop_delays_add_only_the_boundaries_within_the_horizon(
        spw: list[int], horizon: int, whole: list[int], per_hop: list[int]) -> None:
    cfg = tiny(n_stages=4, stages_per_worker=spw, horizon=horizon, consensus_staleness=1,
               steps=10)
    assert ba.gradient_delays(cfg, "whole") == whole == cfg.stage_gradient_delays
    assert ba.gradient_delays(cfg, "per_hop") == per_hop
    assert ba.gradient_delays(cfg.replace(consensus_staleness=0), "per_hop") == [0] * 4
    assert ba.gradient_delays(cfg.replace(consensus_staleness=2), "per_hop") == \
        [2 * d for d in per_hop]
    a, b = ba.async_account(cfg), ba.async_account(cfg, delay_rule="per_hop")
    for w, stages in enumerate(cfg.placement):
        kept = [(cfg.micro_batches * (d + 1) if k < 3 else 1) * ba.stage_saved_bytes(cfg, k)
                for k, d in ((k, per_hop[k]) for k in stages)]
        assert b["workers"][w]["bytes"]["activations_kept"] == sum(kept)
        assert b["workers"][w]["bytes"]["stashed_weights"] == sum(
            ba.FLOAT * ba.stage_parameters(cfg, k) * (per_hop[k] + 1) for k in stages
            if per_hop[k] > 0)
    # per hop never holds more; at H = K it is the same schedule
    assert b["total"] <= a["total"] and (b["total"] == a["total"]) == (horizon == 4)
    from lmrepro.errors import ParameterError

    with pytest.raises(ParameterError, match="delay rule"):
        ba.gradient_delays(cfg, "hop")
