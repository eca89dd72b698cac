"""The compute of one async stage worker (:class:`WorkerStages`), per micro-batch, without its
queues: the worker process (:mod:`lmrepro.rgc.executors.worker`) and the benchmark
(``bench/bench_rgc.py``) drive the same methods.

Running ahead (:attr:`lmrepro.rgc.config.RGCConfig.runs_ahead`, H > 1 with a stale consensus):
a worker backpropagates the graphs of an older step while it trains on the current one, so the
stage weights those graphs were built on must survive the updates in between. Each such stage
runs its forward on a *snapshot* (a copy of its modules taken at that step); the backward fills
the snapshot's gradients, which become the live parameters' gradients (the gradient of the
weights of that older step, applied now). This is weight stashing: one snapshot per step in
flight (docs/rgc.md, "Running ahead").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from lmrepro.errors import check
from lmrepro.model import ByteTransformer
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.executors.events import BACKWARD, FORWARD, READOUT, EventLog
from lmrepro.rgc.core.stages import (merge_gradients, readout_backward, run_stage, stage_backward,
                                     stage_bounds, stage_modules, stage_parameter_names,
                                     stage_parameters, window_bottom)


def worker_state_names(model: ByteTransformer, cfg: RGCConfig, stages: list[int]) -> list[str]:
    """The ``state_dict`` names a worker holds: its stages' parameters and the decoder's."""
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    return [n for k in stages for n in stage_parameter_names(model, bounds, k)] + \
        [f"decoder.{n}" for n, _ in model.decoder.named_parameters()]


def own_stages_model(cfg: RGCConfig, stages: list[int], state: Mapping[str, torch.Tensor]
                     ) -> ByteTransformer:
    """A worker's model: the model's structure with only ``stages`` and the decoder holding
    tensors (every other block, and the embedding unless stage 0 is here, an empty
    ``nn.Identity``), their values from ``state`` (the parent's model, built from the seed, or
    a checkpoint's). Built on the meta device, so the other stages are never allocated."""
    with torch.device("meta"):
        model = ByteTransformer(cfg.model)
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    mine = {i for k in stages for i in range(*bounds[k])}
    for i in range(cfg.model.n_layers):
        if i not in mine:
            model.blocks[i] = nn.Identity()
    if 0 not in stages:
        model.embed = nn.Identity()
    model.to_empty(device="cpu")
    model.load_state_dict({n: state[n] for n in model.state_dict()}, strict=True)
    return model


@dataclass
class Kept:
    """A stage's graph of one micro-batch, kept until the gradients from above arrive: its input
    leaf (None for stage 0: the byte ids), its output and its own readout gradient grouped by
    the stage where it stops; ``x`` is the input as received (for a checkpoint's rebuild)."""

    inp: torch.Tensor | None
    h: torch.Tensor
    own: dict[int, torch.Tensor]
    x: torch.Tensor


def run_modules(mods: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Apply a stage given as its modules (:func:`lmrepro.rgc.core.stages.stage_modules`)."""
    h = x
    for mod in mods:
        h = mod(h)
    return h


class WorkerStages:
    """The compute of one worker: its consecutive ``stages`` of ``model``, per micro-batch.

    :meth:`forward` runs the stages on a micro-batch of step ``step`` (calling ``send`` with the
    last stage's activation before any backward work), reads each stage out (local loss and
    readout gradient) and finishes the backward of every stage no gradient will come back to.
    :meth:`backward` (H > 1) takes the gradients from the next worker for a micro-batch of a kept
    step, backpropagates through the kept stages and returns what continues to the previous
    worker. ``current_stage`` names the stage running, for error reports. With ``events``, each
    stage's blocks forward, readout and backward per micro-batch are recorded there
    (:mod:`lmrepro.rgc.executors.events`).
    """

    def __init__(self, model: ByteTransformer, cfg: RGCConfig, stages: list[int],
                 events: EventLog | None = None, readouts: set[int] | None = None) -> None:
        self.model, self.cfg, self.stages = model, cfg, list(stages)
        self.events = events
        # the stages that read out (RGC: every one); the others only pass gradients on
        self.readouts = set(self.stages) if readouts is None else readouts
        self.bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
        self.params = {k: stage_parameters(model, self.bounds, k) for k in self.stages}
        self.scale = 1.0 / cfg.micro_batches
        # each stage's readout scale: 1/M times its local loss's weight (the last stage's is 1)
        self.readout_scale = [self.scale * w for w in cfg.loss_weights]
        self.current_stage = self.stages[0]
        self.runs_ahead = cfg.runs_ahead
        self._kept: dict[tuple[int, int, int], Kept] = {}            # (step, stage, micro-batch)
        self._done: dict[tuple[int, int, int], dict[int, torch.Tensor]] = {}
        self._snapshots: dict[tuple[int, int], list[nn.Module]] = {}   # (step, stage)

    def waits_for_gradient(self, k: int) -> bool:
        """Whether a gradient comes back to stage ``k`` from the stages above it."""
        return self.cfg.horizon > 1 and k < self.cfg.n_stages - 1

    @property
    def receives_gradients(self) -> bool:
        return self.waits_for_gradient(self.stages[-1])

    @property
    def sends_gradients(self) -> bool:
        return self.cfg.horizon > 1 and self.stages[0] > 0

    def _snapshot(self, step: int, k: int) -> list[nn.Module]:
        """Stage ``k``'s modules as they are at ``step`` (taken once per step)."""
        if (step, k) not in self._snapshots:
            self._snapshots[(step, k)] = [copy.deepcopy(mod) for mod in
                                          stage_modules(self.model, self.bounds, k)]
        return self._snapshots[(step, k)]

    def _run(self, step: int, k: int, inp: torch.Tensor) -> torch.Tensor:
        if self.runs_ahead and self.waits_for_gradient(k):
            return run_modules(self._snapshot(step, k), inp)
        return run_stage(self.model, self.bounds, k, inp)

    def _clock(self) -> int:
        return EventLog.start() if self.events is not None else 0

    def _log(self, phase: int, k: int, step: int, m: int, t0: int) -> None:
        if self.events is not None:
            self.events.add(phase, k, step, m, t0)

    def forward(self, m: int, x: torch.Tensor, y: torch.Tensor,
                send: Callable[[torch.Tensor], None] | None = None, step: int = 0
                ) -> list[float]:
        """Micro-batch ``m`` of step ``step``: ``x`` is the byte ids (stage 0) or the previous
        stage's activation. Runs the blocks of every stage of this worker first, hands the last
        one's activation to ``send`` (so the next worker starts as early as possible: the
        pipeline's fill is the blocks' forward alone), then reads each stage out. Returns the
        local losses (nats) of this worker's stages (of those in ``readouts``)."""
        inputs, outputs, received = [], [], []
        h = x
        for k in self.stages:
            self.current_stage = k
            received.append(h.detach())
            inp = h if k == 0 else h.detach().requires_grad_(self.cfg.horizon > 1)
            t0 = self._clock()
            h = self._run(step, k, inp)
            self._log(FORWARD, k, step, m, t0)
            inputs.append(None if k == 0 else inp)
            outputs.append(h)
        if send is not None:
            send(h)
        losses = []
        for k, stage_in, h, x_k in zip(self.stages, inputs, outputs, received):
            self.current_stage = k
            own: dict[int, torch.Tensor] = {}
            if k in self.readouts:
                t0 = self._clock()
                loss, g_own = readout_backward(self.model, h, y, self.readout_scale[k])
                self._log(READOUT, k, step, m, t0)
                losses.append(loss)
                own = {window_bottom(k, self.cfg.horizon): g_own}
            if self.waits_for_gradient(k):
                self._kept[(step, k, m)] = Kept(stage_in, h, own, x_k)
            else:
                t0 = self._clock()
                self._done[(step, k, m)] = stage_backward(k, h, stage_in, self.params[k], own)
                self._log(BACKWARD, k, step, m, t0)
        return losses

    def backward(self, m: int, incoming: dict[int, torch.Tensor],
                 before_stage: Callable[[int], None] | None = None, step: int = 0
                 ) -> dict[int, torch.Tensor]:
        """Micro-batch ``m`` of step ``step``: the gradients from the next worker (``{bottom
        stage: dL/dh}``) in; the gradients w.r.t. this worker's input that continue below it
        out. Running ahead, the last micro-batch of a step hands the snapshots' gradients to the
        live parameters. ``before_stage(k)`` is called before stage k's backward (faults)."""
        grads = incoming
        for k in reversed(self.stages):
            self.current_stage = k
            if before_stage is not None:
                before_stage(k)
            if (step, k, m) in self._kept:
                kept = self._kept.pop((step, k, m))
                params = (self.params[k] if (step, k) not in self._snapshots else
                          [p for mod in self._snapshots[(step, k)] for p in mod.parameters()])
                t0 = self._clock()
                grads = stage_backward(k, kept.h, kept.inp, params,
                                       merge_gradients(kept.own, grads))
                self._log(BACKWARD, k, step, m, t0)
                if m == self.cfg.micro_batches - 1 and (step, k) in self._snapshots:
                    for p, q in zip(self.params[k], params):
                        p.grad = q.grad
                    del self._snapshots[(step, k)]
            else:
                grads = self._done.pop((step, k, m))
        return grads

    def finish_step(self, step: int = 0, keep_after: int | None = None) -> None:
        """Drop what step ``step`` left; the graphs of the steps after ``keep_after`` (running
        ahead: those still waiting for their gradients) stay, every other one must have been
        consumed (checked)."""
        floor = step if keep_after is None else keep_after
        check(all(s > floor for s, _, _ in self._kept), "kept activations",
              sorted(self._kept), f"must be consumed by the backward phase of step {floor}")
        self._done.clear()

    # -- a checkpoint of the steps in flight (running ahead) ----------------------------------
    def in_flight(self) -> dict[str, Any]:
        """What rebuilds the kept graphs: per (step, stage), the snapshot's weights and per
        micro-batch the input as received and the own readout gradient."""
        out: dict[str, Any] = {}
        for (step, k), mods in sorted(self._snapshots.items()):
            M = self.cfg.micro_batches
            out[f"{step}:{k}"] = {
                "weights": [p.detach().clone() for mod in mods for p in mod.parameters()],
                "x": [self._kept[(step, k, m)].x for m in range(M)],
                "own": [self._kept[(step, k, m)].own for m in range(M)]}
        return out

    def rebuild(self, state: dict[str, Any]) -> None:
        """The kept graphs of :meth:`in_flight`, recomputed on their snapshots (the same
        forward on the same inputs and weights: the same graph)."""
        for key, item in state.items():
            step, k = (int(v) for v in key.split(":"))
            mods = self._snapshot(step, k)
            with torch.no_grad():
                for p, v in zip((p for mod in mods for p in mod.parameters()), item["weights"]):
                    p.copy_(v)
            for m, (x, own) in enumerate(zip(item["x"], item["own"])):
                inp = None if k == 0 else x.detach().requires_grad_(True)
                h = run_modules(mods, x if inp is None else inp)
                self._kept[(step, k, m)] = Kept(inp, h, own, x)
