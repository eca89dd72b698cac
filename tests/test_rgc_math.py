"""RGC math (docs/papers.md ("RGC")): stage cut, horizon, consensus, config errors."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from lmrepro.errors import ParameterError
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.rgc import RGCConfig, ThreadOversubscriptionWarning, consensus_decoder_grad
from lmrepro.rgc.config import check_threads
from lmrepro.rgc.core.stages import (accumulate_rgc_grads, decoder_parameters, forward_stages,
                                     horizon_window, local_loss, run_stage, stage_backward,
                                     stage_bounds, stage_local_grads, stage_parameter_names,
                                     stage_parameters, window_bottom)

torch.set_num_threads(1)


def tiny(n_layers: int = 4, n_stages: int = 4, horizon: int = 1) -> RGCConfig:
    return RGCConfig(model=ModelConfig(n_layers=n_layers, d_model=16, n_heads=2, context=12),
                     n_stages=n_stages, horizon=horizon, batch_size=4, micro_batches=1)


def model_and_batch(cfg: RGCConfig, seed: int = 0
                    ) -> tuple[ByteTransformer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = ByteTransformer(cfg.model)
    # make the residual/readout non-trivial so gradients are not tiny and distinct per stage
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, 256, (3, cfg.model.context), generator=g)
    y = torch.randint(0, 256, (3, cfg.model.context), generator=g)
    return model, x, y


def test_stage_bounds_and_windows() -> None:
    assert stage_bounds(24, 4) == [(0, 6), (6, 12), (12, 18), (18, 24)]
    assert list(horizon_window(3, 1)) == [3]
    assert list(horizon_window(3, 2)) == [2, 3]
    assert list(horizon_window(1, 4)) == [0, 1]
    cfg = tiny()
    model, _, _ = model_and_batch(cfg)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    names = [stage_parameter_names(model, bounds, k) for k in range(cfg.n_stages)]
    # every non-decoder parameter belongs to exactly one stage; the embedding to stage 0
    flat = [n for ns in names for n in ns]
    assert len(flat) == len(set(flat))
    assert set(flat) == {n for n, _ in model.named_parameters() if not n.startswith("decoder.")}
    assert all(n.startswith(("embed.", "blocks.0.")) for n in names[0])
    assert sum(p.numel() for k in range(4) for p in stage_parameters(model, bounds, k)) + \
        sum(p.numel() for p in decoder_parameters(model)) == model.num_parameters()


def test_full_horizon_last_stage_loss_equals_global_backprop() -> None:
    """H = K: the gradient of the final stage's loss, flowing through every stage, is exactly
    backprop of the model's own loss CE(D(h_L), y) (same parameters, same graph)."""
    cfg = tiny(horizon=4)
    model, x, y = model_and_batch(cfg)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    local = stage_local_grads(model, bounds, x, y, cfg.horizon)
    last = local[-1]
    assert list(last.window) == [0, 1, 2, 3]
    named = dict(model.named_parameters())
    names = [n for n in named if not n.startswith("decoder.")]
    ref = torch.autograd.grad(lm_loss(model(x), y), [named[n] for n in names]
                              + decoder_parameters(model))
    assert set(last.params) == set(names)
    for n, g in zip(names, ref[:len(names)]):
        torch.testing.assert_close(last.params[n], g, rtol=1e-5, atol=1e-7)
    for g_rgc, g_bp in zip(last.decoder, ref[len(names):]):
        torch.testing.assert_close(g_rgc, g_bp, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        assert last.loss == pytest.approx(float(lm_loss(model(x), y)), rel=1e-6)


def test_full_horizon_accumulated_grads_equal_backprop_of_summed_local_losses() -> None:
    """H = K: stage parameters get backprop of sum_k L_k; the decoder gets its mean over k.
    The reference is computed independently from ``model(x, return_hidden=True)``."""
    cfg = tiny(n_layers=4, n_stages=2, horizon=2)
    model, x, y = model_and_batch(cfg, seed=3)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    accumulate_rgc_grads(model, bounds, x, y, cfg.horizon)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    _, hidden = model(x, return_hidden=True)
    losses = [lm_loss(model.decoder(hidden[end - 1]), y) for _, end in bounds]
    stage_params = [(n, p) for n, p in model.named_parameters() if not n.startswith("decoder.")]
    ref = torch.autograd.grad(sum(losses), [p for _, p in stage_params], retain_graph=True)
    for (n, _), g in zip(stage_params, ref):
        torch.testing.assert_close(got[n], g, rtol=1e-5, atol=1e-7)
    dec_ref = torch.autograd.grad(sum(losses) / len(losses), decoder_parameters(model))
    for (n, _), g in zip(model.decoder.named_parameters(), dec_ref):
        torch.testing.assert_close(got[f"decoder.{n}"], g, rtol=1e-5, atol=1e-7)


def test_horizon_one_no_gradient_reaches_an_earlier_stage() -> None:
    cfg = tiny(horizon=1)
    model, x, y = model_and_batch(cfg)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    hs = forward_stages(model, bounds, x, horizon=1)
    for k in range(1, cfg.n_stages):
        loss = local_loss(model, hs[k], y)
        earlier = [p for j in range(k) for p in stage_parameters(model, bounds, j)]
        grads = torch.autograd.grad(loss, earlier + stage_parameters(model, bounds, k),
                                    allow_unused=True, retain_graph=True)
        assert all(g is None for g in grads[:len(earlier)]), f"loss {k} reached an earlier stage"
        assert all(g is not None and g.abs().sum() > 0 for g in grads[len(earlier):])
    local = stage_local_grads(model, bounds, x, y, 1)
    for lg in local:
        assert set(lg.params) == set(stage_parameter_names(model, bounds, lg.stage))
    # the embedding learns from stage 0's loss only
    assert "embed.tok.weight" in local[0].params
    assert all("embed.tok.weight" not in lg.params for lg in local[1:])


def test_intermediate_horizon_equals_detaching_at_the_window_edge() -> None:
    """H = 2, K = 4: stage 3's loss updates stages 2 and 3 exactly as if h_1 were detached."""
    cfg = tiny(horizon=2)
    model, x, y = model_and_batch(cfg, seed=5)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    got = stage_local_grads(model, bounds, x, y, 2)[3]
    assert list(got.window) == [2, 3]
    with torch.no_grad():
        h = run_stage(model, bounds, 1, run_stage(model, bounds, 0, x))
    h = run_stage(model, bounds, 3, run_stage(model, bounds, 2, h))
    names = stage_parameter_names(model, bounds, 2) + stage_parameter_names(model, bounds, 3)
    named = dict(model.named_parameters())
    ref = torch.autograd.grad(local_loss(model, h, y), [named[n] for n in names])
    assert list(got.params) == names
    for n, g in zip(names, ref):
        torch.testing.assert_close(got.params[n], g, rtol=1e-5, atol=1e-7)


def test_decoder_gradient_is_the_mean_of_the_stage_readout_gradients() -> None:
    a, b, c = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0]), torch.tensor([-1.0, 1.0])
    torch.testing.assert_close(consensus_decoder_grad([a, b, c]), torch.tensor([1.0, 3.0]))
    cfg = tiny(horizon=1)
    model, x, y = model_and_batch(cfg, seed=7)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    per_stage = []
    for k in range(cfg.n_stages):  # independent: one readout gradient per stage
        hs = forward_stages(model, bounds, x, 1)
        per_stage.append(torch.autograd.grad(local_loss(model, hs[k], y),
                                             decoder_parameters(model)))
    accumulate_rgc_grads(model, bounds, x, y, 1)
    for i, p in enumerate(decoder_parameters(model)):
        mean = sum(g[i] for g in per_stage) / cfg.n_stages
        torch.testing.assert_close(p.grad, mean, rtol=1e-5, atol=1e-8)
        assert not torch.allclose(p.grad, per_stage[-1][i])  # not just the last stage's
    with pytest.raises(ParameterError):
        consensus_decoder_grad([])


@pytest.mark.parametrize("kw, name", [
    (dict(model=dict(n_layers=6), n_stages=4), "rgc.n_stages"),
    (dict(model=dict(n_layers=8), n_stages=4, horizon=0), "rgc.horizon"),
    (dict(model=dict(n_layers=8), n_stages=4, horizon=5), "rgc.horizon"),
    (dict(batch_size=6, micro_batches=4), "rgc.micro_batches"),
    (dict(n_stages=4, threads=(1, 1)), "rgc.threads"),
    (dict(n_stages=4, threads=(1, 0, 1, 1)), "rgc.threads"),
    (dict(n_stages=4, stages_per_worker=(2, 1)), "rgc.stages_per_worker"),
    (dict(n_stages=4, stages_per_worker=(2, 0, 2)), "rgc.stages_per_worker"),
    (dict(n_stages=4, stages_per_worker=(2, 2), threads=(1, 1, 1)),
     "rgc.threads"),
    (dict(n_stages=4, stages_per_worker=(2, 2), threads=(2, 1), cores=2),
     "rgc.threads"),
    (dict(n_stages=4, stages_per_worker=(2, 2), backprop_threads=3, cores=2),
     "rgc.backprop_threads"),
    (dict(steps=3, consensus_staleness=3), "rgc.consensus_staleness"),
    # running ahead: worker 0 of 4 would take its gradients 2 x 3 = 6 steps late, past the end
    (dict(n_stages=4, horizon=2, steps=5, consensus_staleness=2), "rgc.consensus_staleness"),
    (dict(model=dict(d_model=30, n_heads=4)), "rgc.model.n_heads"),
    (dict(model=dict(tie_embeddings=True)), "rgc.model.tie_embeddings"),
    (dict(model=dict(dropout=0.1)), "rgc.model.dropout"),
])
def test_bad_config_names_parameter_value_and_allowed(kw: dict, name: str) -> None:
    with pytest.raises(ParameterError) as ei:
        RGCConfig(**kw)
    assert ei.value.name == name
    assert "must" in str(ei.value) and name in str(ei.value)


def test_oversubscription_warns_clearly() -> None:
    cores = os.cpu_count() or 1
    cfg = RGCConfig(model=dict(n_layers=4), n_stages=2, threads=(cores, 1))
    with pytest.warns(ThreadOversubscriptionWarning, match=r"rgc.threads.*cores"):
        assert check_threads(cfg, "async") == cores + 1
    with pytest.warns(ThreadOversubscriptionWarning, match="rgc.backprop_threads"):
        check_threads(cfg.replace(backprop_threads=cores + 3), "backprop")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_threads(RGCConfig(model=dict(n_layers=4), n_stages=1), "sync", cores=1)


@pytest.mark.parametrize("n_stages, horizon", [(4, 1), (4, 2), (4, 3), (4, 4), (3, 2)])
@pytest.mark.parametrize("placement", ["one per worker", "two workers", "one worker"])
def test_pipelined_backward_equals_the_windowed_local_gradients(n_stages: int, horizon: int,
                                                                placement: str) -> None:
    """The async executor's compute (``WorkerStages``: stage inputs as fresh leaves, readout
    gradients, gradients sent down grouped by the stage where they stop), run here in one
    process with the messages passed by hand, accumulates exactly the sync executor's
    gradients (``accumulate_rgc_grads``) for every horizon and placement, over 2 micro-batches."""
    from lmrepro.rgc.executors.worker_stages import WorkerStages

    cfg = RGCConfig(model=ModelConfig(n_layers=n_stages, d_model=16, n_heads=2, context=12),
                    n_stages=n_stages, horizon=horizon, batch_size=4, micro_batches=2)
    groups = {"one per worker": [[k] for k in range(n_stages)],
              "two workers": [list(range(n_stages // 2)), list(range(n_stages // 2, n_stages))],
              "one worker": [list(range(n_stages))]}[placement]
    model, x, y = model_and_batch(cfg, seed=11)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        accumulate_rgc_grads(model, bounds, xm, ym, horizon, scale=0.5)
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    workers = [WorkerStages(model, cfg, g) for g in groups]
    for m, (xm, ym) in enumerate(zip(x.chunk(2), y.chunk(2))):
        h = xm
        for wk in workers:
            sent: list[torch.Tensor] = []
            wk.forward(m, h, ym, send=sent.append)
            h = sent[0].detach().clone() if sent else h
    for m in range(2):
        down: dict[int, torch.Tensor] = {}
        for wk in reversed(workers):
            down = wk.backward(m, down) if horizon > 1 else {}
            assert all(e < wk.stages[0] for e in down)   # only what continues below is sent
            assert len(down) <= min(wk.stages[0], horizon - 1)
    for wk in workers:
        wk.finish_step()
    # the decoder gets the sum of the readout gradients; the executors divide by K at the
    # consensus (the all-reduce), so compare the mean
    for n, p in model.named_parameters():
        got = p.grad / n_stages if n.startswith("decoder.") else p.grad
        torch.testing.assert_close(got, want[n], rtol=1e-5, atol=1e-7, msg=n)


def test_stage_backward_stops_each_gradient_at_the_bottom_of_its_window() -> None:
    """K = 4, H = 3: L_2's gradient stops at stage 0, L_3's at stage 1. Stage 2 sends both down,
    apart; stage 1 backpropagates both into its parameters but sends only L_2's on."""
    assert [window_bottom(k, 3) for k in range(4)] == [0, 0, 0, 1]
    cfg = tiny(horizon=3)
    model, x, y = model_and_batch(cfg, seed=2)
    bounds = stage_bounds(4, 4)
    with torch.no_grad():
        h0 = run_stage(model, bounds, 0, x)
    inp1 = h0.clone().requires_grad_(True)
    h1 = run_stage(model, bounds, 1, inp1)
    inp2 = h1.detach().requires_grad_(True)
    h2 = run_stage(model, bounds, 2, inp2)
    g_l2, g_l3 = torch.randn_like(h2), torch.randn_like(h2)
    sent = stage_backward(2, h2, inp2, stage_parameters(model, bounds, 2), {0: g_l2, 1: g_l3})
    assert set(sent) == {0, 1}
    h2 = run_stage(model, bounds, 2, inp2)
    torch.testing.assert_close(sent[1], torch.autograd.grad(h2, inp2, g_l3, retain_graph=True)[0])
    torch.testing.assert_close(sent[0], torch.autograd.grad(h2, inp2, g_l2)[0])
    p1 = stage_parameters(model, bounds, 1)
    onward = stage_backward(1, h1, inp1, p1, sent)
    assert set(onward) == {0}
    h1 = run_stage(model, bounds, 1, inp1)
    ref = torch.autograd.grad(h1, [*p1, inp1], sent[0] + sent[1], retain_graph=True)
    for p, g in zip(p1, ref[:-1]):
        torch.testing.assert_close(p.grad, g)
    torch.testing.assert_close(onward[0], torch.autograd.grad(h1, inp1, sent[0])[0])


def test_a_worker_holds_only_its_stages_and_the_decoder() -> None:
    """The async worker's model (``own_stages_model``, from its part of the start state,
    ``worker_start``): the tensors of its stages and of the decoder, equal to the full model's,
    and nothing of the other stages; its stages compute what the full model's do."""
    from lmrepro.rgc.executors.async_ import worker_start
    from lmrepro.rgc.executors.worker_stages import own_stages_model

    cfg = RGCConfig(model=ModelConfig(n_layers=8, d_model=16, n_heads=2, context=12),
                    n_stages=4, batch_size=4, micro_batches=2, stages_per_worker=[1, 2, 1])
    full, x, _ = model_and_batch(cfg, seed=5)
    state = full.state_dict()
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    for w, stages in enumerate(cfg.placement):
        part = worker_start(cfg, w, full, None)
        model = own_stages_model(cfg, stages, part["model"])
        got = model.state_dict()
        want = {n for k in stages for n in stage_parameter_names(full, bounds, k)} | {
            n for n in state if n.startswith("decoder.")}
        assert set(got) == set(part["model"]) == want
        assert all(torch.equal(got[n], state[n]) for n in got)
        assert sum(p.numel() for p in model.parameters()) == sum(state[n].numel() for n in want)
        h = x if stages[0] == 0 else torch.randn(4, 12, 16)
        for k in stages:
            torch.testing.assert_close(run_stage(model, bounds, k, h),
                                       run_stage(full, bounds, k, h), rtol=0, atol=0)
