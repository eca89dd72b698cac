"""RGC math: cutting the model into stages, local losses, the horizon and the consensus.

docs/papers.md ("RGC"). The :class:`lmrepro.model.ByteTransformer` is cut into K
stages of L/K blocks. Stage 0 also owns the embedding: the embedding's gradient comes from the
losses whose horizon reaches stage 0 (with H = 1 only stage 0's own loss). Every stage reads out
through the one shared decoder D (final LayerNorm + head):

* local loss of stage k: ``L_k = CE(D(h_k), y)`` (next-byte cross-entropy, nats);
* horizon H: ``L_k`` updates the blocks of stages ``max(0, k-H+1) .. k`` only (0-indexed); with
  H = 1 the input of every stage is detached;
* consensus: D's gradient is the mean over stages of ``dL_k/dD``.

Blocks of stage j receive ``sum over k in reach of dL_k/dtheta_j`` (each local loss at full
weight). With H = K that is global backprop of ``sum_k L_k``; in particular the part coming from
the last stage's loss equals plain backprop of the model's own loss ``CE(D(h_L), y)``.

**Weighted local losses** (``rgc.local_loss_weight`` lambda; :attr:`RGCConfig.loss_weights`):
stage k's loss enters with weight ``w_k`` = lambda for the intermediate stages and 1 for the
last (the model's own loss), so the blocks of stage j receive ``sum over k in reach of w_k
dL_k/dtheta_j`` and the decoder the *weighted* mean ``sum_k w_k dL_k/dD / sum_k w_k``. The
normalisation by ``sum_k w_k`` (rather than by K) is chosen so that lambda = 1 is the plain
mean (RGC as published, bit-identical: the unweighted code path) and lambda = 0 at H = K is
global backprop of the model's own loss exactly, the decoder included (dividing by K instead
would hand the decoder 1/K of backprop's gradient: AdamW hides a constant factor up to its
``eps``, but it is not backprop). In between the decoder follows the normalised weighted
objective ``sum_k w_k L_k / sum_k w_k``; the stages the unnormalised one, as at lambda = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from lmrepro.errors import check
from lmrepro.model import ByteTransformer, lm_loss


def stage_bounds(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """Block index ranges ``[start, end)`` of each stage: K equal cuts of L blocks."""
    check(n_stages >= 1 and n_layers % n_stages == 0, "rgc.n_stages", n_stages,
          f"must be >= 1 and divide rgc.model.n_layers = {n_layers}")
    per = n_layers // n_stages
    return [(k * per, (k + 1) * per) for k in range(n_stages)]


def horizon_window(k: int, horizon: int) -> range:
    """Stages (0-indexed) whose parameters receive the gradient of stage ``k``'s local loss."""
    check(horizon >= 1, "rgc.horizon", horizon, "must be an integer >= 1")
    return range(max(0, k - horizon + 1), k + 1)


def stage_modules(model: ByteTransformer, bounds: Sequence[tuple[int, int]], k: int
                  ) -> list[nn.Module]:
    """The modules of stage ``k``: its blocks, and the embedding for stage 0 (decoder excluded)."""
    start, end = bounds[k]
    mods: list[nn.Module] = [model.embed] if k == 0 else []
    return mods + [model.blocks[i] for i in range(start, end)]


def stage_parameters(model: ByteTransformer, bounds: Sequence[tuple[int, int]], k: int
                     ) -> list[nn.Parameter]:
    return [p for m in stage_modules(model, bounds, k) for p in m.parameters()]


def stage_parameter_names(model: ByteTransformer, bounds: Sequence[tuple[int, int]], k: int
                          ) -> list[str]:
    """Names (as in ``model.state_dict()``) of stage ``k``'s parameters."""
    start, end = bounds[k]
    prefixes = (["embed."] if k == 0 else []) + [f"blocks.{i}." for i in range(start, end)]
    return [n for n, _ in model.named_parameters() if n.startswith(tuple(prefixes))]


def decoder_parameters(model: ByteTransformer) -> list[nn.Parameter]:
    return list(model.decoder.parameters())


def run_stage(model: ByteTransformer, bounds: Sequence[tuple[int, int]], k: int,
              inp: torch.Tensor) -> torch.Tensor:
    """Apply stage ``k``: ``inp`` is the byte ids for stage 0, else the hidden state h_{k-1}."""
    start, end = bounds[k]
    h = model.embed(inp) if k == 0 else inp
    for i in range(start, end):
        h = model.blocks[i](h)
    return h


def local_loss(model: ByteTransformer, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Stage-local loss: next-byte cross-entropy (nats) of the shared decoder's readout of ``h``."""
    return lm_loss(model.decoder(h), y)


def forward_stages(model: ByteTransformer, bounds: Sequence[tuple[int, int]], x: torch.Tensor,
                   horizon: int) -> list[torch.Tensor]:
    """Hidden states ``[h_1, ..., h_K]`` of the stage outputs.

    With ``horizon == 1`` every stage input is detached (no graph crosses a stage boundary); with
    a larger horizon the graph is kept and :func:`stage_local_grads` restricts each loss to its
    window (autograd only walks paths to the requested inputs).
    """
    hs: list[torch.Tensor] = []
    h: torch.Tensor = x
    for k in range(len(bounds)):
        if k > 0 and horizon == 1:
            h = h.detach()
        h = run_stage(model, bounds, k, h)
        hs.append(h)
    return hs


def consensus_decoder_grad(per_stage_grads: Sequence[torch.Tensor],
                           divisor: float | None = None) -> torch.Tensor:
    """Readout-Gradient Consensus: the mean of the stages' gradients w.r.t. one decoder tensor;
    with ``divisor`` (the sum of the losses' weights, when the gradients are of weighted losses)
    their sum divided by it, the weighted mean."""
    check(len(per_stage_grads) >= 1, "per_stage_grads", len(per_stage_grads),
          "must hold at least one gradient")
    stacked = torch.stack([g.detach() for g in per_stage_grads])
    return stacked.mean(dim=0) if divisor is None else stacked.sum(dim=0) / divisor


def is_unweighted(weights: Sequence[float] | None) -> bool:
    """Whether every local loss has weight 1 (``None``: unweighted)."""
    return weights is None or all(w == 1.0 for w in weights)


@dataclass
class LocalGrads:
    """Gradients of one stage's local loss.

    Attributes:
        stage: k.
        loss: the local loss value (nats).
        window: the stages reached by the gradient (the horizon window).
        params: gradient of every reached stage parameter, by ``state_dict`` name.
        decoder: gradient w.r.t. each decoder parameter (the stage's readout gradient).
    """

    stage: int
    loss: float
    window: range
    params: dict[str, torch.Tensor]
    decoder: list[torch.Tensor]


def stage_local_grads(model: ByteTransformer, bounds: Sequence[tuple[int, int]],
                      x: torch.Tensor, y: torch.Tensor, horizon: int, scale: float = 1.0,
                      weights: Sequence[float] | None = None) -> list[LocalGrads]:
    """Per-stage local-loss gradients on one (micro-)batch, without touching ``.grad``.

    ``scale`` multiplies every loss (``1 / micro_batches`` for gradient accumulation), and
    ``weights[k]`` stage k's (null: 1 each); ``LocalGrads.loss`` stays the unweighted loss.
    """
    w = [1.0] * len(bounds) if weights is None else list(weights)
    check(len(w) == len(bounds), "weights", w, f"must hold one weight per stage ({len(bounds)})")
    hs = forward_stages(model, bounds, x, horizon)
    dec = decoder_parameters(model)
    out: list[LocalGrads] = []
    n = len(bounds)
    for k in range(n):
        window = horizon_window(k, horizon)
        names = [nm for j in window for nm in stage_parameter_names(model, bounds, j)]
        params = [p for j in window for p in stage_parameters(model, bounds, j)]
        loss = local_loss(model, hs[k], y)
        grads = torch.autograd.grad(loss * (scale * w[k]), params + dec,
                                    retain_graph=horizon > 1 and k < n - 1)
        out.append(LocalGrads(stage=k, loss=float(loss.detach()), window=window,
                              params=dict(zip(names, grads[:len(params)])),
                              decoder=list(grads[len(params):])))
    return out


def accumulate_rgc_grads(model: ByteTransformer, bounds: Sequence[tuple[int, int]],
                         x: torch.Tensor, y: torch.Tensor, horizon: int, scale: float = 1.0,
                         weights: Sequence[float] | None = None) -> list[float]:
    """One RGC backward on a micro-batch: add every stage's horizon-bounded local gradients to
    the stage parameters' ``.grad`` and the consensus (mean) readout gradient to the decoder's.
    With ``weights`` (stage k's loss weighted by ``weights[k]``; the module docstring) the
    consensus is the weighted mean; all ones (or None) take the unweighted path, so lambda = 1
    is bit-identical to RGC without weights. Returns the local losses (nats) of stages 0..K-1."""
    if is_unweighted(weights):
        weights = None
    local = stage_local_grads(model, bounds, x, y, horizon, scale, weights)
    divisor = None if weights is None else float(sum(weights))
    named = dict(model.named_parameters())
    for lg in local:
        for name, g in lg.params.items():
            p = named[name]
            p.grad = g.clone() if p.grad is None else p.grad.add_(g)
    for i, p in enumerate(decoder_parameters(model)):
        g = consensus_decoder_grad([lg.decoder[i] for lg in local], divisor)
        p.grad = g if p.grad is None else p.grad.add_(g)
    return [lg.loss for lg in local]


# -- the pipelined backward of the asynchronous executor ----------------------------------------
#
# Stage k runs its blocks on an input leaf (the received h_{k-1}, detached) and reads out through
# its decoder replica. The gradient of a local loss L_i travels down the stages until the bottom
# of its window, stage ``window_bottom(i, H) = max(0, i-H+1)``; there it stops. Gradients that
# stop at the same stage can be summed, so what stage k sends to stage k-1 is one tensor per
# bottom stage below k (``{bottom: dL/dh_{k-1}}``): one tensor for H = 2 and for H = K, at most
# min(k, H-1) in general.

def window_bottom(k: int, horizon: int) -> int:
    """The lowest stage reached by the gradient of stage ``k``'s local loss."""
    return horizon_window(k, horizon).start


def readout_backward(model: ByteTransformer, h: torch.Tensor, y: torch.Tensor, scale: float
                     ) -> tuple[float, torch.Tensor]:
    """Stage-local readout: ``L = CE(D(h), y)``; adds ``scale * dL/dD`` to the decoder's
    ``.grad`` and returns ``(L in nats, scale * dL/dh)``. The readout's graph (the logits) is
    freed here; ``h``'s own graph is untouched."""
    leaf = h.detach().requires_grad_(True)
    loss = local_loss(model, leaf, y)
    torch.autograd.backward(loss * scale, inputs=[leaf, *decoder_parameters(model)])
    assert leaf.grad is not None
    return float(loss.detach()), leaf.grad


def merge_gradients(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]
                    ) -> dict[int, torch.Tensor]:
    """Sum two ``{bottom stage: gradient}`` maps (gradients w.r.t. the same tensor)."""
    out = dict(a)
    for e, g in b.items():
        out[e] = out[e] + g if e in out else g
    return out


def stage_backward(k: int, h: torch.Tensor, inp: torch.Tensor | None,
                   params: Sequence[torch.Tensor], grads: dict[int, torch.Tensor],
                   ) -> dict[int, torch.Tensor]:
    """Backpropagate through stage ``k`` the gradients w.r.t. its output ``h``, grouped by the
    stage where each stops (``grads``: ``{bottom: dL/dh_k}``, the stage's own readout gradient
    included). Adds ``d(sum)/dtheta_k`` to the stage parameters' ``.grad`` and returns the
    gradients w.r.t. ``inp`` of the groups that continue below k (``bottom < k``), for stage
    k-1; empty when none does (then ``inp`` may be None). Frees ``h``'s graph."""
    cont = {e: g for e, g in sorted(grads.items()) if e < k}
    params = list(params)
    if not cont:
        total = sum(grads.values())
        torch.autograd.backward(h, total, inputs=params)
        return {}
    check(inp is not None and inp.requires_grad, "inp", None if inp is None else inp.shape,
          "must be the stage's input leaf (requires_grad) when a gradient continues below it")
    assert inp is not None
    if len(cont) == len(grads) == 1:
        # the common case (H = 2 above the last stage, H = K): one pass for both
        (e, g), = cont.items()
        out = torch.autograd.grad(h, [*params, inp], g)
        for p, gp in zip(params, out[:-1]):
            p.grad = gp if p.grad is None else p.grad.add_(gp)
        return {e: out[-1]}
    torch.autograd.backward(h, sum(grads.values()), inputs=params, retain_graph=True)
    sent = {}
    for i, (e, g) in enumerate(cont.items()):
        sent[e] = torch.autograd.grad(h, inp, g, retain_graph=i < len(cont) - 1)[0]
    return sent
