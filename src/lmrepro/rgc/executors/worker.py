"""One async stage worker (a process): its side of the protocol with the parent and its
neighbours (:class:`StageWorker`, :mod:`lmrepro.rgc.executors.wire`) around its stages' compute
(:class:`lmrepro.rgc.executors.worker_stages.WorkerStages`); docs/rgc.md describes the data flow of
a step, in lockstep and running ahead. The worker process's body is
:mod:`lmrepro.rgc.executors.worker_process`."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lmrepro.checkpoints import Checkpoints
from lmrepro.data.batches import sample_batch
from lmrepro.lifetime import fault_armed, fault_point
from lmrepro.optim.comm import grads_to_flat
from lmrepro.rgc.core.checkpoint import state_from_bytes, state_to_bytes
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.executors.consensus_queue import ConsensusQueue
from lmrepro.rgc.executors.events import EventLog
from lmrepro.rgc.executors.faults import stage_fault_point
from lmrepro.rgc.core.recipe import lr_at, make_adamw, micro_batches, set_lr
from lmrepro.rgc.core.run_spec import cadence
from lmrepro.rgc.core.stages import decoder_parameters, stage_parameter_names
from lmrepro.rgc.executors.wire import (Channels, MappedBytes, PartSaved, StateAfter, StepDone,
                                        WorkerEvents, received, tagged, untag)
from lmrepro.rgc.executors.worker_stages import WorkerStages, own_stages_model
from lmrepro.seeds import batches_offset


@dataclass
class WorkerArgs:
    """What the parent hands worker ``w`` at its start: the configuration (as a dict), the seed,
    the rendezvous port, its part of the start state (its stages' and the decoder's weights,
    and when resuming the rest of its part of the checkpoint), the step to stop before, the
    training data (stage 0's worker only), the run's checkpoints (when one is due, and where
    the worker saves its part), its queues (``fwd_in``, ``fwd_out``, ``bwd_in``,
    ``bwd_out``; None where it has no neighbour), the results queue, the parent's ``stop``,
    ``finish`` and ``go`` events, the shared wait ``status`` array and the parent's armed fault
    point (:func:`lmrepro.lifetime.fault_spec`: the fork server may have started before a test
    armed it) and what the worker trains (``kind``: RGC, or the pipelined global backprop)."""

    w: int
    cfg_dict: dict[str, Any]
    seed: int
    port: int
    start: bytes            # its part of the start state (worker_start), as torch.save bytes
    stop_step: int
    train_data: np.ndarray | MappedBytes | None   # stage 0's worker: a file mapping by path
    checkpoints: Checkpoints   # no run directory: the worker sends its part instead
    queues: dict[str, Any]
    results: Any
    stop: Any
    finish: Any
    go: Any
    status: Any
    faults: str | None
    kind: str = "rgc"       # or "pipelined_backprop" (lmrepro.rgc.executors.pipelined)


def _fault_points(stages: list[int], step: int, timeout_s: float, backward: bool = False
                  ) -> None:
    """The fault points of ``stages`` at ``step`` (tests only: :func:`stage_fault_point`); a
    hang lasts ten timeouts, long enough for the others to notice."""
    for k in stages:
        fault_point(stage_fault_point(k, step, backward), hang_s=10 * timeout_s)


def _slip(stage: int, step: int, backward: bool) -> int:
    """1 when a test armed stage ``stage``'s mislabel fault point at ``step``
    (:func:`lmrepro.rgc.executors.faults.stage_fault_point`): its messages then carry the next
    step's tag; 0 otherwise."""
    return int(fault_armed(stage_fault_point(stage, step, backward, mislabel=True)))


class StageWorker:
    """Worker ``w``'s side of a run: its stages, their optimizers and the decoder replica with
    its consensus, the batch generator (stage 0's worker), and its channels."""

    def __init__(self, a: WorkerArgs, cfg: RGCConfig) -> None:
        self.a, self.cfg = a, cfg
        self.train_data = received(a.train_data)
        self.stages = cfg.placement[a.w]
        self.first, self.last = self.stages[0], self.stages[-1]
        start = state_from_bytes(a.start)
        a.start = b""             # the bytes would stay alive as long as the worker otherwise
        model = own_stages_model(cfg, self.stages, start["model"])
        model.train()
        self.model = model
        self.events = EventLog()
        self.runner = WorkerStages(model, cfg, self.stages, self.events)
        self.names = {k: stage_parameter_names(model, self.runner.bounds, k) for k in self.stages}
        self.dec = decoder_parameters(model)
        self.dec_names = [f"decoder.{n}" for n, _ in model.decoder.named_parameters()]
        self.opts = {k: make_adamw(model, self.runner.params[k], cfg) for k in self.stages}
        self.opt_dec = make_adamw(model, self.dec, cfg)
        self.gen = batches_offset(a.seed) if self.first == 0 else None
        self.consensus = ConsensusQueue(self.dec, cfg.consensus_staleness)
        self.link = Channels(a.w, a.stop, cfg.timeout_s, a.status)
        self.start = 0
        # running ahead: this worker backpropagates step t - lag at step t, and keeps the
        # gradients it sent in the last s steps (in flight at a checkpoint)
        self.lag = cfg.stage_gradient_delays[self.first]
        self.sent: deque[tuple[int, list[dict[int, torch.Tensor]]]] = deque()
        if "step" in start:       # a resumed run
            self.restore(start)

    def restore(self, ck: dict[str, Any]) -> None:
        """Everything but the weights (already the model's) from this worker's part of a
        checkpoint (:func:`lmrepro.rgc.executors.async_.worker_start`)."""
        for k in self.stages:
            self.opts[k].load_state_dict(ck["optims"][f"stage{k}"])
        self.opt_dec.load_state_dict(ck["optims"]["decoder"])
        if self.gen is not None:
            self.gen.set_state(ck["gen_state"])
        self.consensus.restore(ck.get("pending_consensus", []))
        self.start = int(ck["step"])
        mine = ck.get("in_flight", {}).get("workers", {}).get(self.a.w)
        if mine:
            self.runner.rebuild(mine["graphs"])
            self.sent = deque(mine["sent"])

    def resend(self) -> None:
        """After a resume: the gradients sent before the checkpoint that the previous worker had
        not yet read (running ahead), again and in order."""
        for step, msgs in self.sent:
            for m, out in enumerate(msgs):
                self._send_gradient(step, m, out)

    def train(self) -> None:
        """Every step to ``stop_step``; the state after each step the parent checkpoints or
        evaluates (and the last): with a run directory, each worker saves its own part there
        at a checkpoint and at the last step (the parent reads what it needs from disk, so no
        state travels through it); otherwise, and for an evaluation between checkpoints, the
        state goes to the parent as bytes."""
        due, ckpts = cadence(self.cfg), self.a.checkpoints
        self.resend()
        for step in range(self.start, self.a.stop_step):
            self.step(step)
            done = step + 1
            last_or_ckpt = done == self.a.stop_step or ckpts.due(done)
            if ckpts.on_disk and last_or_ckpt:
                t0 = time.perf_counter()
                ckpts.save_part(done, self.a.w, self.state())
                self.a.results.put(PartSaved(self.a.w, done, time.perf_counter() - t0))
            elif last_or_ckpt or due.eval_due(done):
                self.a.results.put(StateAfter(self.a.w, done, state_to_bytes(self.state())))
        self.a.results.put(WorkerEvents(self.a.w, self.events.rows))

    def step(self, step: int) -> None:
        """One step: the forward phase, the backward phase (H > 1), the stages' updates, then
        the decoder's consensus and update; reports the losses and where the time went."""
        cfg, runner = self.cfg, self.runner
        waited0 = self.link.waited_s
        runner.current_stage = self.first
        self.events.at = step
        _fault_points(self.stages, step, cfg.timeout_s)
        set_lr([*self.opts.values(), self.opt_dec], lr_at(cfg, step))
        for opt in [*self.opts.values(), self.opt_dec]:
            opt.zero_grad(set_to_none=True)
        losses = self._forward_phase(step)
        kept = step - self.lag        # the step whose graphs are backpropagated now
        if cfg.horizon > 1 and kept >= 0:
            self._backward_phase(step, kept)
        runner.finish_step(step, keep_after=kept)
        runner.current_stage = self.first
        # the stages' own updates need no consensus: done while slower workers finish
        for opt in self.opts.values():
            opt.step()
        t_consensus = time.perf_counter()
        applied = self._consensus()
        t_consensus = time.perf_counter() - t_consensus
        if applied:
            self.opt_dec.step()
        per_stage = np.mean(np.array(losses), axis=0)
        self.a.results.put(StepDone(self.a.w, step,
                                    {k: float(v) for k, v in zip(self.stages, per_stage)},
                                    self.link.waited_s - waited0, t_consensus))

    def _forward_phase(self, step: int) -> list[list[float]]:
        cfg, q, last = self.cfg, self.a.queues, self.last
        if self.first == 0:
            assert self.train_data is not None and self.gen is not None
            x, y = sample_batch(self.train_data, cfg.batch_size, cfg.model.context, self.gen)
            micro = micro_batches(x, y, cfg.micro_batches)
        losses = []
        for m in range(cfg.micro_batches):
            if self.first == 0:
                inp, ym = micro[m]
            else:
                what = f"step {step} micro-batch {m} activations from stage {self.first - 1}"
                inp, ym = untag(self.link.get(q["fwd_in"], what, self.first - 1), step, m,
                                self.first - 1, f"stage {self.first} waiting for {what}")

            def send(h: torch.Tensor, m: int = m, ym: torch.Tensor = ym) -> None:
                self.link.put(q["fwd_out"], tagged(step + _slip(last, step, False), m, last,
                                                   (h, ym)),
                              f"step {step} micro-batch {m} activations to stage {last + 1}",
                              last + 1)

            losses.append(self.runner.forward(m, inp, ym,
                                              send if last < cfg.n_stages - 1 else None, step))
            del inp
        return losses

    def _backward_phase(self, step: int, kept: int) -> None:
        """At step ``step``, the backward of step ``kept``'s graphs (the same step in lockstep):
        the gradients of that step from the next worker in, what continues out."""
        q, runner, tmo = self.a.queues, self.runner, self.cfg.timeout_s

        def before_stage(k: int) -> None:
            _fault_points([k], step, tmo, backward=True)

        sent = []
        for m in range(self.cfg.micro_batches):
            runner.current_stage = self.last
            incoming = {}
            if runner.receives_gradients:
                what = f"step {kept} micro-batch {m} gradient from stage {self.last + 1}"
                incoming = untag(self.link.get(q["bwd_in"], what, self.last + 1), kept, m,
                                 self.last + 1, f"stage {self.last} waiting for {what}")
            out = runner.backward(m, incoming, None if m else before_stage, kept)
            if runner.sends_gradients:
                self._send_gradient(step, m, out)
                sent.append(out)
        if sent and self.cfg.runs_ahead:
            s = self.cfg.consensus_staleness
            self.sent.append((step, sent))
            while self.sent and self.sent[0][0] <= step - s:
                self.sent.popleft()

    def _send_gradient(self, step: int, m: int, out: dict[int, torch.Tensor]) -> None:
        """Micro-batch ``m``'s gradients, sent at ``step``, to the previous worker, which reads
        them ``consensus_staleness`` steps later when running ahead (at once in lockstep); not
        sent when that is past this invocation's last step (they stay in :attr:`sent`)."""
        if self.cfg.runs_ahead and step + self.cfg.consensus_staleness >= self.a.stop_step:
            return
        kept = step - self.lag + _slip(self.first, step, True)   # the step of the graph
        self.link.put(self.a.queues["bwd_out"], tagged(kept, m, self.first, out),
                      f"step {kept} micro-batch {m} gradient to stage {self.first - 1}",
                      self.first - 1)

    def _consensus(self) -> bool:
        """All-reduce the decoder's readout gradients (sum / K; with weighted local losses
        sum / sum_k w_k, the weighted mean: :attr:`RGCConfig.consensus_divisor`); apply the one
        due now."""
        divisor = self.cfg.consensus_divisor
        flat = grads_to_flat(self.dec, torch.empty(sum(p.numel() for p in self.dec)))
        if self.cfg.consensus_staleness == 0:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            self.consensus.push(flat.div_(divisor))
        else:
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)

            def complete() -> None:
                # waited for when the gradient is due (consensus_staleness steps later)
                assert work is not None
                work.wait()
                flat.div_(divisor)

            self.consensus.push(flat, finish=complete)
        return self.consensus.pop_into_grads()

    def state(self) -> dict[str, Any]:
        """This worker's part of the training state (stage 0's worker: with the decoder, its
        optimizer, the generator and the pending consensus gradients)."""
        sd = self.model.state_dict()
        payload: dict[str, Any] = {
            "params": {n: sd[n] for k in self.stages for n in self.names[k]},
            "opt_stages": {f"stage{k}": self.opts[k].state_dict() for k in self.stages},
        }
        if self.first == 0:
            assert self.gen is not None
            payload["decoder"] = {n: sd[n] for n in self.dec_names}
            payload["opt_dec"] = self.opt_dec.state_dict()
            payload["gen_state"] = self.gen.get_state()
            payload["pending_consensus"] = self.consensus.state()
        if self.cfg.runs_ahead:
            payload["in_flight"] = {"graphs": self.runner.in_flight(), "sent": list(self.sent)}
        return payload

