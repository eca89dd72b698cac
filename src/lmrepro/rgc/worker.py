"""One async stage worker (a process): its stages' compute (:class:`WorkerStages`) and its side
of the protocol with the parent and its neighbours (:class:`StageWorker`, :mod:`lmrepro.rgc.wire`);
docs/rgc.md describes the data flow of a step."""

from __future__ import annotations

import datetime
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lmrepro.data.batches import sample_batch
from lmrepro.errors import check
from lmrepro.lifetime import die_with_multiprocessing_parent, fault_point, set_fault_spec
from lmrepro.model import ByteTransformer
from lmrepro.optim.comm import grads_to_flat
from lmrepro.results import save_part
from lmrepro.rgc.common import (ConsensusQueue, batch_generator, build_model, cadence, lr_at,
                                make_adamw, micro_batches, set_lr, stage_fault_point,
                                state_from_bytes, state_to_bytes)
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.stages import (decoder_parameters, merge_gradients, readout_backward, run_stage,
                                stage_backward, stage_bounds, stage_parameter_names,
                                stage_parameters, window_bottom)
from lmrepro.rgc.wire import (Channels, Failed, Finished, MappedBytes, PartSaved, Ready, Started,
                              StateAfter, StepDone, Stopped, from_wire, received, to_wire)


class WorkerStages:
    """The compute of one worker: its consecutive ``stages`` of ``model``, per micro-batch.

    :meth:`forward` runs the stages on a micro-batch (calling ``send`` with the last stage's
    activation before any backward work), reads each stage out (local loss and readout
    gradient) and finishes the backward of every stage no gradient will come back to.
    :meth:`backward` (H > 1) takes the gradients from the next worker, backpropagates through the
    kept stages and returns what continues to the previous worker. The benchmark times these
    same methods alone (``bench/bench_rgc.py``). ``current_stage`` names the stage running, for
    error reports.
    """

    def __init__(self, model: ByteTransformer, cfg: RGCConfig, stages: list[int]) -> None:
        self.model, self.cfg, self.stages = model, cfg, list(stages)
        self.bounds = stage_bounds(cfg.n_layers, cfg.n_stages)
        self.params = {k: stage_parameters(model, self.bounds, k) for k in self.stages}
        self.scale = 1.0 / cfg.micro_batches
        self.current_stage = self.stages[0]
        self._kept: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor,
                                                dict[int, torch.Tensor]]] = {}
        self._done: dict[tuple[int, int], dict[int, torch.Tensor]] = {}

    def waits_for_gradient(self, k: int) -> bool:
        """Whether a gradient comes back to stage ``k`` from the stages above it."""
        return self.cfg.horizon > 1 and k < self.cfg.n_stages - 1

    @property
    def receives_gradients(self) -> bool:
        return self.waits_for_gradient(self.stages[-1])

    @property
    def sends_gradients(self) -> bool:
        return self.cfg.horizon > 1 and self.stages[0] > 0

    def forward(self, m: int, x: torch.Tensor, y: torch.Tensor,
                send: Callable[[torch.Tensor], None] | None = None) -> list[float]:
        """Micro-batch ``m``: ``x`` is the byte ids (stage 0) or the previous stage's
        activation. Runs the blocks of every stage of this worker first, hands the last one's
        activation to ``send`` (so the next worker starts as early as possible: the pipeline's
        fill is the blocks' forward alone), then reads each stage out. Returns the local losses
        (nats) of this worker's stages."""
        inputs, outputs = [], []
        h = x
        for k in self.stages:
            self.current_stage = k
            inp = h if k == 0 else h.detach().requires_grad_(self.cfg.horizon > 1)
            h = run_stage(self.model, self.bounds, k, inp)
            inputs.append(None if k == 0 else inp)
            outputs.append(h)
        if send is not None:
            send(h)
        losses = []
        for k, stage_in, h in zip(self.stages, inputs, outputs):
            self.current_stage = k
            loss, g_own = readout_backward(self.model, h, y, self.scale)
            losses.append(loss)
            own = {window_bottom(k, self.cfg.horizon): g_own}
            if self.waits_for_gradient(k):
                self._kept[(k, m)] = (stage_in, h, own)
            else:
                self._done[(k, m)] = stage_backward(k, h, stage_in, self.params[k], own)
        return losses

    def backward(self, m: int, incoming: dict[int, torch.Tensor],
                 before_stage: Callable[[int], None] | None = None) -> dict[int, torch.Tensor]:
        """Micro-batch ``m``'s gradients from the next worker (``{bottom stage: dL/dh}``) in;
        the gradients w.r.t. this worker's input that continue below it out.
        ``before_stage(k)`` is called before stage k's backward (fault injection)."""
        grads = incoming
        for k in reversed(self.stages):
            self.current_stage = k
            if before_stage is not None:
                before_stage(k)
            if (k, m) in self._kept:
                inp, h, own = self._kept.pop((k, m))
                grads = stage_backward(k, h, inp, self.params[k], merge_gradients(own, grads))
            else:
                grads = self._done.pop((k, m))
        return grads

    def finish_step(self) -> None:
        """Drop what the step left (nothing, after a complete step: checked)."""
        check(not self._kept, "kept activations", sorted(self._kept),
              "must be consumed by the backward phase")
        self._done.clear()


@dataclass
class WorkerArgs:
    """What the parent hands worker ``w`` at its start: the configuration (as a dict), the seed,
    the rendezvous port, the checkpoint (``torch.save`` bytes, or None), the step to stop
    before, the training data (stage 0's worker only), its queues (``fwd_in``, ``fwd_out``,
    ``bwd_in``, ``bwd_out``; None where it has no neighbour), the results queue, the parent's
    ``stop``, ``finish`` and ``go`` events, the shared wait ``status`` array and the parent's
    armed fault point (:func:`lmrepro.lifetime.fault_spec`: the fork server may have started
    before a test armed it)."""

    w: int
    cfg_dict: dict[str, Any]
    seed: int
    port: int
    ckpt: bytes | None
    stop_step: int
    train_data: np.ndarray | MappedBytes | None   # stage 0's worker: a file mapping by path
    run_dir: str | None       # where the worker saves its part of the state (None: send it)
    queues: dict[str, Any]
    results: Any
    stop: Any
    finish: Any
    go: Any
    status: Any
    faults: str | None


def _fault_points(stages: list[int], step: int, timeout_s: float, backward: bool = False
                  ) -> None:
    """The fault points of ``stages`` at ``step`` (tests only: :func:`stage_fault_point`); a
    hang lasts ten timeouts, long enough for the others to notice."""
    for k in stages:
        fault_point(stage_fault_point(k, step, backward), hang_s=10 * timeout_s)


class StageWorker:
    """Worker ``w``'s side of a run: its stages, their optimizers and the decoder replica with
    its consensus, the batch generator (stage 0's worker), and its channels."""

    def __init__(self, a: WorkerArgs, cfg: RGCConfig) -> None:
        self.a, self.cfg = a, cfg
        self.train_data = received(a.train_data)
        self.stages = cfg.placement[a.w]
        self.first, self.last = self.stages[0], self.stages[-1]
        model = build_model(cfg, a.seed)
        model.train()
        self.model = model
        self.runner = WorkerStages(model, cfg, self.stages)
        self.names = {k: stage_parameter_names(model, self.runner.bounds, k) for k in self.stages}
        self.dec = decoder_parameters(model)
        self.dec_names = [f"decoder.{n}" for n, _ in model.decoder.named_parameters()]
        self.opts = {k: make_adamw(model, self.runner.params[k], cfg) for k in self.stages}
        self.opt_dec = make_adamw(model, self.dec, cfg)
        self.gen = batch_generator(a.seed) if self.first == 0 else None
        self.consensus = ConsensusQueue(self.dec, cfg.consensus_staleness)
        self.link = Channels(a.w, a.stop, cfg.worker_timeout_s, a.status)
        self.start = 0

    def restore(self, ckpt: bytes) -> None:
        ck = state_from_bytes(ckpt)
        self.model.load_state_dict(ck["model"])
        for k in self.stages:
            self.opts[k].load_state_dict(ck["optims"][f"stage{k}"])
        self.opt_dec.load_state_dict(ck["optims"]["decoder"])
        if self.gen is not None:
            self.gen.set_state(ck["gen_state"])
        self.consensus.restore(ck.get("pending_consensus", []))
        self.start = int(ck["step"])

    def train(self) -> None:
        """Every step to ``stop_step``; the state after each step the parent checkpoints or
        evaluates (and the last): with a run directory, each worker saves its own part there
        at a checkpoint and at the last step (the parent reads what it needs from disk, so no
        state travels through it); otherwise, and for an evaluation between checkpoints, the
        state goes to the parent as bytes."""
        due = cadence(self.cfg)
        for step in range(self.start, self.a.stop_step):
            self.step(step)
            done = step + 1
            last_or_ckpt = done == self.a.stop_step or due.checkpoint_due(done)
            if self.a.run_dir is not None and last_or_ckpt:
                t0 = time.perf_counter()
                save_part(self.a.run_dir, done, self.a.w, self.state())
                self.a.results.put(PartSaved(self.a.w, done, time.perf_counter() - t0))
            elif last_or_ckpt or due.eval_due(done):
                self.a.results.put(StateAfter(self.a.w, done, state_to_bytes(self.state())))

    def step(self, step: int) -> None:
        """One step: the forward phase, the backward phase (H > 1), the stages' updates, then
        the decoder's consensus and update; reports the losses and where the time went."""
        cfg, runner = self.cfg, self.runner
        waited0 = self.link.waited_s
        runner.current_stage = self.first
        _fault_points(self.stages, step, cfg.worker_timeout_s)
        set_lr([*self.opts.values(), self.opt_dec], lr_at(cfg, step))
        for opt in [*self.opts.values(), self.opt_dec]:
            opt.zero_grad(set_to_none=True)
        losses = self._forward_phase(step)
        if cfg.horizon > 1:
            self._backward_phase(step)
        runner.finish_step()
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
            x, y = sample_batch(self.train_data, cfg.batch_size, cfg.context, self.gen)
            micro = micro_batches(x, y, cfg.micro_batches)
        losses = []
        for m in range(cfg.micro_batches):
            if self.first == 0:
                inp, ym = micro[m]
            else:
                inp, ym = from_wire(self.link.get(
                    q["fwd_in"], f"step {step} micro-batch {m} activations from stage "
                    f"{self.first - 1}", self.first - 1))

            def send(h: torch.Tensor, m: int = m, ym: torch.Tensor = ym) -> None:
                self.link.put(q["fwd_out"], to_wire((h, ym)),
                              f"step {step} micro-batch {m} activations to stage {last + 1}",
                              last + 1)

            losses.append(self.runner.forward(m, inp, ym,
                                              send if last < cfg.n_stages - 1 else None))
            del inp
        return losses

    def _backward_phase(self, step: int) -> None:
        q, runner, tmo = self.a.queues, self.runner, self.cfg.worker_timeout_s

        def before_stage(k: int) -> None:
            _fault_points([k], step, tmo, backward=True)

        for m in range(self.cfg.micro_batches):
            runner.current_stage = self.last
            incoming = from_wire(self.link.get(
                q["bwd_in"], f"step {step} micro-batch {m} gradient from stage "
                f"{self.last + 1}", self.last + 1)) if runner.receives_gradients else {}
            out = runner.backward(m, incoming, None if m else before_stage)
            if runner.sends_gradients:
                self.link.put(q["bwd_out"], to_wire(out), f"step {step} micro-batch {m} "
                              f"gradient to stage {self.first - 1}", self.first - 1)

    def _consensus(self) -> bool:
        """All-reduce the decoder's readout gradients (sum / K); apply the one due now."""
        K = self.cfg.n_stages
        flat = grads_to_flat(self.dec, torch.empty(sum(p.numel() for p in self.dec)))
        if self.cfg.consensus_staleness == 0:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            self.consensus.push(flat.div_(K))
        else:
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)

            def complete() -> None:
                # waited for when the gradient is due (consensus_staleness steps later)
                assert work is not None
                work.wait()
                flat.div_(K)

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
        return payload


def _stage_worker(a: WorkerArgs) -> None:
    """Body of worker ``a.w``'s process: the protocol with the parent (:mod:`lmrepro.rgc.wire`).
    Every failure goes to the parent as :class:`Failed`, with its traceback."""
    die_with_multiprocessing_parent()      # ends with the run's process (docs/reliability.md)
    set_fault_spec(a.faults)
    worker: StageWorker | None = None
    stages: list[int] = []
    try:
        cfg = RGCConfig(**a.cfg_dict)
        stages = cfg.placement[a.w]
        torch.set_num_threads(cfg.worker_threads[a.w])
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.w,
            world_size=cfg.n_workers, timeout=datetime.timedelta(seconds=cfg.worker_timeout_s))
        # the parent measures the tree now, with every worker's runtime up and no data yet
        a.results.put(Started(a.w))
        if not a.go.wait(timeout=cfg.worker_timeout_s):
            raise TimeoutError(f"the parent did not start the run within "
                               f"{cfg.worker_timeout_s:.0f} s (rgc.worker_timeout_s)")
        worker = StageWorker(a, cfg)
        if a.ckpt is not None:
            worker.restore(a.ckpt)
        a.results.put(Ready(a.w))
        worker.train()
        a.results.put(Finished(a.w))
        a.finish.wait(timeout=cfg.worker_timeout_s)
    except Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        stage = (worker.runner.current_stage if worker is not None
                 else (stages[0] if stages else a.w))
        a.results.put(Failed(a.w, stage, traceback.format_exc(), getattr(exc, "peer", None)))
        a.finish.wait(timeout=30)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
