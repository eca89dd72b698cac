"""The one global-backprop trainer: the baseline stage's runs and RGC's ``backprop`` executor.

:func:`train_backprop` is the whole trainer: each step samples a batch from the caller's
generator, splits it into micro-batches, accumulates their gradients (each micro-batch loss
scaled by ``1/micro_batches``, so the sum is the full batch's mean-loss gradient), clips the
global gradient norm (optional) and takes one optimizer step (:func:`backprop_step`). The run
around the step (resume, schedule, cadences, records, timing) is the harness's
(:mod:`lmrepro.harness`); the caller builds the :class:`~lmrepro.harness.Run` and a
:class:`BackpropSpec` with what differs between callers: the model and its initialisation, the
optimizer, the batch generator's seed, micro-batches, clipping, threads, the evaluation and how
the run ends (its summary).

Checkpoints hold :func:`lmrepro.checkpoints.single_model_state`, the layout every single-model
trainer shares (RGC's executors add their pending gradients to it), so a resumed run is
bit-identical to an uninterrupted one on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from tqdm.auto import tqdm

from lmrepro.checkpoints import ALL, restore_single_model, single_model_state
from lmrepro.data.batches import sample_batch
from lmrepro.evaluation import bits_per_byte
from lmrepro.harness import Run
from lmrepro.model import lm_loss

log = logging.getLogger(__name__)

#: what the caller's ``finish`` returns (a summary dict, a result object)
R = TypeVar("R")


@dataclass(frozen=True)
class BackpropSpec(Generic[R]):
    """What one global-backprop run takes from its caller (:func:`train_backprop`).

    ``model`` holds the parameters (clipped, checkpointed, evaluated); ``forward`` is the module
    the training forward passes go through (e.g. ``torch.compile(model)``; default ``model``).
    Each step samples ``batch_size`` windows of ``context + 1`` bytes of ``data`` with
    ``generator``. ``evaluate`` returns the per-batch validation losses (nats) for the periodic
    evaluations; ``finish(run, end)`` ends the invocation (final evaluation, summary) and gives
    the result. ``record(loss)`` is the step's record (default ``{"loss": loss}``);
    ``stop_after`` stops the invocation early, as if killed; ``progress`` names a progress bar
    (None: no bar); ``threads``: torch intra-op threads during the run (None: unchanged)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    data: np.ndarray
    batch_size: int
    context: int
    evaluate: Callable[[], list[float]]
    finish: Callable[[Run, int], R]
    micro_batches: int = 1
    max_grad_norm: float = 0.0
    forward: torch.nn.Module | None = None
    threads: int | None = None
    record: Callable[[float], dict[str, Any]] | None = None
    stop_after: int | None = None
    progress: str | None = None


def backprop_step(forward: torch.nn.Module, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                  micro_batches: int = 1, max_grad_norm: float = 0.0) -> float:
    """One optimisation step of global backprop on the batch ``(x, y)``: the gradients of its
    ``micro_batches`` parts accumulated, the global norm clipped to ``max_grad_norm`` (0: not
    clipped), one ``optimizer`` step. Returns the mean of the parts' losses (nats)."""
    optimizer.zero_grad(set_to_none=True)
    scale = 1.0 / micro_batches
    losses = []
    for xm, ym in zip(x.chunk(micro_batches, dim=0), y.chunk(micro_batches, dim=0)):
        loss = lm_loss(forward(xm), ym)
        (loss * scale).backward()       # the sum over parts is the full batch's mean gradient
        losses.append(float(loss.detach()))
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return sum(losses) / len(losses)


def train_backprop(run: Run, spec: BackpropSpec[R]) -> R:
    """Train ``spec.model`` with global backprop on the harness ``run`` (not yet entered):
    resume from its last checkpoint, train to the last step (or ``spec.stop_after``), then
    ``spec.finish(run, end)``, whose result it returns."""
    model, opt, gen = spec.model, spec.optimizer, spec.generator
    forward = spec.forward if spec.forward is not None else model
    steps = run.cadence.steps
    prev_threads = torch.get_num_threads()
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    try:
        with run:
            start = run.resume(lambda ck: restore_single_model(ck, model, {ALL: opt}, gen))
            end = steps if spec.stop_after is None else max(start, min(steps, spec.stop_after))
            log.info("global backprop: %d params, steps %d..%d of %d -> %s",
                     sum(p.numel() for p in model.parameters()), start, end, steps, run.out_dir)
            bar = tqdm(initial=start, total=steps, desc=spec.progress,
                       disable=spec.progress is None)

            def step(i: int, lr: float) -> dict[str, Any]:
                for group in opt.param_groups:
                    group["lr"] = lr
                x, y = sample_batch(spec.data, spec.batch_size, spec.context, gen)
                loss = backprop_step(forward, model, opt, x, y, spec.micro_batches,
                                     spec.max_grad_norm)
                bar.update()
                bar.set_postfix(loss=f"{loss:.3f}")
                return spec.record(loss) if spec.record is not None else {"loss": loss}

            model.train()
            try:
                run.train(step, lambda: single_model_state(
                    model.state_dict(), {ALL: opt.state_dict()}, gen.get_state()),
                          lambda: bits_per_byte(spec.evaluate()), end)
            finally:    # an error ends the bar's line first: its message starts a line of its own
                bar.close()
            return spec.finish(run, end)
    finally:
        torch.set_num_threads(prev_threads)
