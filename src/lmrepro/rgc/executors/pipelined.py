"""The ``pipelined_backprop`` executor: global backprop pipelined over the async executor's
worker processes and threads (docs/rgc.md, "The same-layout control").

Async RGC runs the stages on W worker processes of a few threads each; backprop runs in one
process. A throughput ratio between them mixes RGC's decoupling (no gradient waits across stages
at H = 1) with the process layout (small per-process thread groups, activation copies). This
executor runs exact global backprop in the same layout: the same placement, threads, queues and
micro-batches as async RGC, GPipe-style with a flush per step:

* forward, per micro-batch: each worker runs its stages on the activation from the previous
  worker and sends its last stage's activation on (the async executor's forward,
  :class:`lmrepro.rgc.executors.worker_stages.WorkerStages` with horizon K); only the last stage
  reads out, through the model's own decoder: the model's loss ``CE(D(h_L), y)``, scaled by 1/M;
* backward, per micro-batch: the last worker backpropagates at once, every other worker when the
  gradient w.r.t. its output arrives, and sends the gradient w.r.t. its input down (tagged, as in
  the async executor);
* update: each worker steps the AdamW of its stages, the last worker the decoder's; nothing is
  averaged (only one replica of the decoder learns: the others hold the initial weights, unused).

It computes what the ``backprop`` executor computes (the same batches, loss, micro-batch
scaling, AdamW settings and no clipping; per-stage AdamW instances are the same per-coordinate
update): equal losses to float rounding, tested. The horizon and the consensus staleness are
RGC's and do not apply: the executor runs with H = K and s = 0 (:func:`pipelined_config`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.core.recipe import lr_at, set_lr
from lmrepro.rgc.executors.wire import StepDone
from lmrepro.rgc.executors.worker import StageWorker, WorkerArgs
from lmrepro.rgc.executors.worker_stages import WorkerStages

KIND = "pipelined_backprop"


def pipelined_config(cfg: RGCConfig) -> RGCConfig:
    """The configuration the executor runs: ``cfg`` with the full horizon (every gradient goes
    down to stage 0), no consensus staleness (a flush per step) and no intermediate local loss
    weight to record (only the last stage reads out)."""
    return cfg.replace(horizon=cfg.n_stages, consensus_staleness=0, local_loss_weight=1.0)


class PipelinedWorker(StageWorker):
    """Worker ``w`` of the pipelined global backprop: the async worker's channels, state and
    checkpoints, with only the last stage reading out and no consensus."""

    def __init__(self, a: WorkerArgs, cfg: RGCConfig) -> None:
        super().__init__(a, cfg)
        self.holds_readout = self.last == cfg.n_stages - 1
        self.runner = WorkerStages(self.model, cfg, self.stages, self.events,
                                   readouts={cfg.n_stages - 1} & set(self.stages))

    def step(self, step: int) -> None:
        """Forward every micro-batch, backward every micro-batch, then the updates (the flush:
        every gradient of the step is in before any weight changes)."""
        cfg, runner = self.cfg, self.runner
        waited0 = self.link.waited_s
        runner.current_stage = self.first
        self.events.at = step
        opts = [*self.opts.values(), self.opt_dec]
        set_lr(opts, lr_at(cfg, step))
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        losses = self._forward_phase(step)
        self._backward_phase(step, step)
        runner.finish_step(step)
        for opt in self.opts.values():
            opt.step()
        mine: dict[int, float] = {}
        if self.holds_readout:
            self.opt_dec.step()
            mine = {self.last: float(np.mean([per_micro[0] for per_micro in losses]))}
        self.a.results.put(StepDone(self.a.w, step, mine, self.link.waited_s - waited0, 0.0))

    def state(self) -> dict[str, Any]:
        """This worker's part of the training state: its stages' parameters and optimizers;
        the last worker's with the decoder and its optimizer, the first worker's with the
        generator."""
        sd = self.model.state_dict()
        payload: dict[str, Any] = {
            "params": {n: sd[n] for k in self.stages for n in self.names[k]},
            "opt_stages": {f"stage{k}": self.opts[k].state_dict() for k in self.stages}}
        if self.holds_readout:
            payload["decoder"] = {n: sd[n] for n in self.dec_names}
            payload["opt_dec"] = self.opt_dec.state_dict()
        if self.first == 0:
            assert self.gen is not None
            payload["gen_state"] = self.gen.get_state()
            payload["pending_consensus"] = []
        return payload
