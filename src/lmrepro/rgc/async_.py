"""Asynchronous RGC executor: the stages on worker processes (docs/rgc.md).

Why processes and not threads: the design measurement found no parallel speed-up from two
Python threads and a process-global thread count; rerun on the current torch it no longer does
(``bench/bench_rgc.py --design``), and processes are kept for failure isolation, per-worker
allocators and the paper's process-tree memory. See docs/rgc.md, "Deviations and decisions".

Placement: the K stages run on W <= K worker processes, worker w holding consecutive stages
(``RGCConfig.placement``) with ``threads_per_worker[w]`` intra-op threads, so a 4-stage model can
run on 2 cores without oversubscription. Inside a worker, consecutive stages hand over their
activations in memory; between workers they travel through bounded queues.

Data flow of one step (:class:`WorkerStages` is one worker's compute):

* the worker of stage 0 samples the step's batch from the seeded generator (the same batches as
  the sync executor) and splits it into micro-batches;
* forward phase, per micro-batch: each stage runs its blocks on its input (a fresh leaf: the
  received activation, detached), the worker sends the activation of its last stage
  ``(h.detach().clone(), y)`` to the next worker *before* any readout or backward work, so the
  next worker starts at once; then each stage reads out through its decoder replica (local
  loss, readout gradient) and, when no gradient will come back to it (H = 1, or the last stage),
  backpropagates through its blocks at once and frees the graph;
* backward phase (H > 1 only), per micro-batch in order: a worker receives from the next
  worker the gradients w.r.t. its last stage's output, grouped by the stage where each stops
  (:func:`lmrepro.rgc.stages.stage_backward`), adds its stages' own readout gradients,
  backpropagates through its stages (the kept activations) and sends the gradients that
  continue to the previous worker. H = K is global backprop of the sum of the local losses;
* consensus: one gloo ``all_reduce`` (sum, then / K) of the flattened decoder gradients over
  127.0.0.1 per step among the W workers; every replica applies the same mean gradient, in the
  same step (``consensus_staleness`` 0) or s steps later (bounded staleness s: the all-reduce
  runs in the background meanwhile);
* the parent only collects per-step losses, states for checkpoints, and errors.

A worker that raises sends its traceback to the parent, which stops every worker and raises
:class:`StageWorkerError` naming the stage that was running; a worker that dies without a word
(killed, segfault) is noticed from its exit code. Every queue get/put (forward activations and
backward gradients alike) and the collective have timeouts (``config.worker_timeout_s``); a
timeout names the stage that did not deliver, so nothing hangs and the culprit is named.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_mod
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lmrepro.data.batches import sample_batch
from lmrepro.distributed import free_port
from lmrepro.errors import check
from lmrepro.evaluation import bits_per_byte
from lmrepro.lifetime import (die_with_multiprocessing_parent, fault_point, fault_spec,
                              set_fault_spec)
from lmrepro.memory import Memory, MemorySampler
from lmrepro.model import ByteTransformer
from lmrepro.optim.comm import grads_to_flat
from lmrepro.results import holds_writer_lock
from lmrepro.rgc.common import (Clock, ConsensusQueue, Recorder, TrainResult, batch_generator,
                                build_model, evaluate, load_state, lr_at, make_adamw,
                                make_summary, micro_batches, run_identity, save_state, set_lr,
                                stage_fault_point, state_from_bytes, state_to_bytes)
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.stages import (decoder_parameters, merge_gradients, readout_backward, run_stage,
                                stage_backward, stage_bounds, stage_parameter_names,
                                stage_parameters, window_bottom)

POLL_S = 0.5


class StageWorkerError(RuntimeError):
    """A worker failed; ``stage`` is the stage it was running (for a silent death, the first
    stage of the worker), ``worker`` the process; the message carries the traceback."""

    def __init__(self, stage: int, detail: str, worker: int | None = None) -> None:
        self.stage = stage
        self.worker = worker
        self.detail = detail
        where = f" (worker {worker})" if worker is not None else ""
        super().__init__(f"RGC async stage {stage} failed{where}:\n{detail}")


class WaitTimeout(TimeoutError):
    """A worker waited ``rgc.worker_timeout_s`` on stage ``peer`` (to receive from it or to send
    to it)."""

    def __init__(self, message: str, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class _Channels:
    """One worker's waits on its neighbours: every queue get/put polls the parent's stop event,
    gives up after ``timeout_s`` (:class:`WaitTimeout`), and publishes in the shared ``status``
    array what the worker is waiting for, so that the parent can follow a chain of waiting
    workers to the stage that really stopped (:func:`_stalled_stage`)."""

    COMPUTING, RECEIVING, SENDING = 0, 1, 2

    def __init__(self, w: int, stop: Any, timeout_s: float, status: Any) -> None:
        self.w, self.stop, self.timeout_s, self.status = w, stop, timeout_s, status
        self.waited_s = 0.0   # time spent in get/put, i.e. waiting on a neighbour or the queue

    def _waiting(self, kind: int, peer: int) -> None:
        self.status[2 * self.w + 1] = peer
        self.status[2 * self.w] = kind

    def get(self, q: Any, what: str, sender: int) -> Any:
        return self._wait(lambda: q.get(timeout=POLL_S), queue_mod.Empty, self.RECEIVING,
                          sender, f"for {what}")

    def put(self, q: Any, item: Any, what: str, receiver: int) -> None:
        self._wait(lambda: q.put(item, timeout=POLL_S), queue_mod.Full, self.SENDING,
                   receiver, f"to send {what}")

    def _wait(self, attempt: Callable[[], Any], busy: type[Exception], kind: int, peer: int,
              what: str) -> Any:
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        self._waiting(kind, peer)
        try:
            while True:
                if self.stop.is_set():
                    raise _Stopped()
                try:
                    result = attempt()
                except busy:
                    if time.monotonic() > deadline:
                        # the status keeps saying "waiting on peer": the parent follows the
                        # chain of waits through this worker to the stage that stopped
                        raise WaitTimeout(f"waited {self.timeout_s:.0f} s {what} "
                                          f"(rgc.worker_timeout_s); is stage {peer} alive?",
                                          peer) from None
                    continue
                self._waiting(self.COMPUTING, -1)
                return result
        finally:
            self.waited_s += time.perf_counter() - t0


def _to_wire(obj: Any) -> Any:
    """Tensors (in a tuple or a dict) as numpy copies, which a queue pickles by value through
    its pipe: measured here faster than torch's shared-memory hand-over (one shared-memory
    segment and file descriptor per tensor, docs/rgc.md), and the copy is the "activation copy"
    the executor keeps apart from the sender's graph."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().numpy().copy()
    if isinstance(obj, tuple):
        return tuple(_to_wire(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _to_wire(v) for k, v in obj.items()}
    return obj


def _from_wire(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, tuple):
        return tuple(_from_wire(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _from_wire(v) for k, v in obj.items()}
    return obj


def _stalled_stage(status: Any, placement: list[list[int]], peer: int) -> tuple[int, list[int]]:
    """Follow the waits from stage ``peer``: while its worker is itself waiting on another
    stage, move to that one. Returns the stage at the end (whose worker is computing, hung or
    dead: the one that stopped the pipeline) and the chain of stages walked."""
    worker_of = {k: w for w, ks in enumerate(placement) for k in ks}
    chain = [peer]
    while True:
        w = worker_of[chain[-1]]
        if status[2 * w] == _Channels.COMPUTING:
            return chain[-1], chain
        nxt = int(status[2 * w + 1])
        if nxt in chain or nxt not in worker_of:
            return chain[-1], chain
        chain.append(nxt)


class _Stopped(Exception):
    """The parent asked this worker to stop (another worker failed)."""


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
        for k, inp, h in zip(self.stages, inputs, outputs):
            self.current_stage = k
            loss, g_own = readout_backward(self.model, h, y, self.scale)
            losses.append(loss)
            own = {window_bottom(k, self.cfg.horizon): g_own}
            if self.waits_for_gradient(k):
                self._kept[(k, m)] = (inp, h, own)
            else:
                self._done[(k, m)] = stage_backward(k, h, inp, self.params[k], own)
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


def _fault_points(stages: list[int], step: int, timeout_s: float, backward: bool = False
                  ) -> None:
    """The fault points of ``stages`` at ``step`` (tests only: :func:`stage_fault_point`); a
    hang lasts ten timeouts, long enough for the others to notice."""
    for k in stages:
        fault_point(stage_fault_point(k, step, backward), hang_s=10 * timeout_s)


def _stage_worker(w: int, cfg_dict: dict, seed: int, port: int, ckpt: bytes | None,
                  stop_step: int, train_data: np.ndarray | None, queues: dict[str, Any],
                  results: Any, stop: Any, finish: Any, go: Any, status: Any,
                  faults: str | None) -> None:
    """Body of worker ``w``'s process; reports ``("ready"|"step"|"state"|"done"|"error", w,
    ...)`` to the parent. ``faults``: the parent's armed fault point (:func:`fault_spec`; the
    fork server may have started before a test armed it)."""
    die_with_multiprocessing_parent()      # ends with the run's process (docs/reliability.md)
    set_fault_spec(faults)
    runner: WorkerStages | None = None
    stages: list[int] = []
    try:
        cfg = RGCConfig(**cfg_dict)
        K, M, W = cfg.n_stages, cfg.micro_batches, cfg.n_workers
        stages = cfg.placement[w]
        first, last = stages[0], stages[-1]
        torch.set_num_threads(cfg.worker_threads[w])
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w, world_size=W,
            timeout=datetime.timedelta(seconds=cfg.worker_timeout_s))
        # the parent measures the tree now, with every worker's runtime up and no data yet
        results.put(("started", w))
        if not go.wait(timeout=cfg.worker_timeout_s):
            raise TimeoutError(f"the parent did not start the run within "
                               f"{cfg.worker_timeout_s:.0f} s (rgc.worker_timeout_s)")
        model = build_model(cfg, seed)
        model.train()
        runner = WorkerStages(model, cfg, stages)
        names = {k: stage_parameter_names(model, runner.bounds, k) for k in stages}
        dec = decoder_parameters(model)
        opts = {k: make_adamw(model, runner.params[k], cfg) for k in stages}
        opt_dec = make_adamw(model, dec, cfg)
        gen = batch_generator(seed) if first == 0 else None
        start = 0
        pending: list[torch.Tensor] = []
        if ckpt is not None:
            ck = state_from_bytes(ckpt)
            model.load_state_dict(ck["model"])
            for k in stages:
                opts[k].load_state_dict(ck["optims"][f"stage{k}"])
            opt_dec.load_state_dict(ck["optims"]["decoder"])
            if gen is not None:
                gen.set_state(ck["gen_state"])
            pending = list(ck.get("pending_consensus", []))
            start = int(ck["step"])
            del ck
        consensus = ConsensusQueue(dec, cfg.consensus_staleness, pending)
        dec_names = [f"decoder.{n}" for n, _ in model.decoder.named_parameters()]
        n_dec = sum(p.numel() for p in dec)
        results.put(("ready", w, os.getpid()))
        tmo = cfg.worker_timeout_s
        link = _Channels(w, stop, tmo, status)
        for step in range(start, stop_step):
            t0 = time.perf_counter()
            waited0 = link.waited_s
            runner.current_stage = first
            _fault_points(stages, step, tmo)
            set_lr([*opts.values(), opt_dec], lr_at(cfg, step))
            for opt in [*opts.values(), opt_dec]:
                opt.zero_grad(set_to_none=True)
            if first == 0:
                x, y = sample_batch(train_data, cfg.batch_size, cfg.context, gen)
                micro = micro_batches(x, y, M)
            losses = []
            for m in range(M):
                if first == 0:
                    inp, ym = micro[m]
                else:
                    inp, ym = _from_wire(link.get(
                        queues["fwd_in"], f"step {step} micro-batch {m} activations from stage "
                        f"{first - 1}", first - 1))

                def send(h: torch.Tensor, m: int = m, ym: torch.Tensor = ym,
                         step: int = step) -> None:
                    link.put(queues["fwd_out"], _to_wire((h, ym)),
                             f"step {step} micro-batch {m} activations to stage {last + 1}",
                             last + 1)

                losses.append(runner.forward(m, inp, ym, send if last < K - 1 else None))
                del inp
            if cfg.horizon > 1:
                for m in range(M):
                    runner.current_stage = last
                    incoming = _from_wire(link.get(
                        queues["bwd_in"], f"step {step} micro-batch {m} gradient from stage "
                        f"{last + 1}", last + 1)) if runner.receives_gradients else {}
                    out = runner.backward(m, incoming, None if m else (
                        lambda k, step=step: _fault_points([k], step, tmo, backward=True)))
                    if runner.sends_gradients:
                        link.put(queues["bwd_out"], _to_wire(out), f"step {step} micro-batch {m} "
                                 f"gradient to stage {first - 1}", first - 1)
            runner.finish_step()
            runner.current_stage = first
            # the stages' own updates need no consensus: done while slower workers finish
            for opt in opts.values():
                opt.step()
            t_consensus = time.perf_counter()
            flat = grads_to_flat(dec, torch.empty(n_dec))
            if cfg.consensus_staleness == 0:
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                consensus.push(flat.div_(K))
            else:
                work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
                consensus.push(flat, finish=lambda work=work, flat=flat: (work.wait(),
                                                                           flat.div_(K)))
            applied = consensus.pop_into_grads()
            t_consensus = time.perf_counter() - t_consensus
            if applied:
                opt_dec.step()
            done = step + 1
            per_stage = np.mean(np.array(losses), axis=0)
            # where the step's time went: waiting on the queues, in the consensus (the all-reduce,
            # i.e. waiting for the slowest worker), the rest computing
            results.put(("step", w, step, {k: float(v) for k, v in zip(stages, per_stage)},
                         time.perf_counter() - t0,
                         {"wait_s": link.waited_s - waited0, "consensus_s": t_consensus}))
            want_state = done == stop_step or (
                cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or (
                cfg.eval_every and done % cfg.eval_every == 0)
            if want_state:
                sd = model.state_dict()
                payload: dict[str, Any] = {
                    "params": {n: sd[n] for k in stages for n in names[k]},
                    "opt_stages": {f"stage{k}": opts[k].state_dict() for k in stages},
                }
                if first == 0:
                    payload["decoder"] = {n: sd[n] for n in dec_names}
                    payload["opt_dec"] = opt_dec.state_dict()
                    payload["gen_state"] = gen.get_state()
                    payload["pending_consensus"] = consensus.state()
                results.put(("state", w, done, state_to_bytes(payload)))
        results.put(("done", w, None))
        finish.wait(timeout=tmo)
    except _Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        stage = runner.current_stage if runner is not None else (stages[0] if stages else w)
        results.put(("error", w, stage, traceback.format_exc(), getattr(exc, "peer", None)))
        finish.wait(timeout=30)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def _assemble(cfg: RGCConfig, parts: dict[int, dict]
              ) -> tuple[dict, dict, torch.Tensor, list[torch.Tensor]]:
    """Full model state, optimizer states by name, generator state and the pending consensus
    gradients from the W workers' payloads."""
    model_state: dict[str, torch.Tensor] = {}
    optims: dict[str, dict] = {}
    for w in range(cfg.n_workers):
        model_state.update(parts[w]["params"])
        optims.update(parts[w]["opt_stages"])
    model_state.update(parts[0]["decoder"])
    optims["decoder"] = parts[0]["opt_dec"]
    return model_state, optims, parts[0]["gen_state"], parts[0]["pending_consensus"]


def _mp_context() -> Any:
    """``forkserver`` with torch and this module preloaded: the server imports torch once per
    parent process and forks each stage from a single-threaded process (no inherited OpenMP pool,
    no repeated multi-second import). Falls back to ``spawn`` where forkserver does not exist."""
    try:
        ctx = mp.get_context("forkserver")
    except ValueError:
        return mp.get_context("spawn")
    # torch._dynamo is imported by the first optimizer construction (~3 s per process)
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.optim", "torch.distributed",
                                "lmrepro.rgc.async_"])
    return ctx


@holds_writer_lock("out_dir")     # one writer per run directory (docs/reliability.md)
def train_async(cfg: RGCConfig, train_data: np.ndarray, val_data: np.ndarray,
                out_dir: Path | None = None, corpus: str = "synthetic", name: str | None = None,
                stop_after: int | None = None, seed: int = 0) -> TrainResult:
    """Run the async executor; see :func:`lmrepro.rgc.train`. The stage workers' fault points
    (tests only) are :data:`lmrepro.rgc.common.FAULT_POINT`."""
    ctx = _mp_context()
    sampler = MemorySampler().start()
    identity = run_identity(cfg, "async", seed)
    ck = load_state(out_dir, identity)
    start = int(ck["step"]) if ck is not None else 0
    ck_bytes = state_to_bytes(ck) if ck is not None else None
    del ck
    end = cfg.steps if stop_after is None else max(start, min(cfg.steps, stop_after))
    rec = Recorder(out_dir, start)
    K, W = cfg.n_stages, cfg.n_workers
    template = build_model(cfg, seed)
    if end == start:
        return _finish_without_steps(cfg, template, out_dir, val_data, rec, start, sampler,
                                     corpus, name, seed, identity)
    fwd = [ctx.Queue(maxsize=cfg.queue_size) for _ in range(W - 1)]
    bwd = [ctx.Queue(maxsize=cfg.queue_size) for _ in range(W - 1)] if cfg.horizon > 1 else []
    results = ctx.Queue()
    stop, finish, go = ctx.Event(), ctx.Event(), ctx.Event()
    status = ctx.Array("i", 2 * W, lock=False)  # per worker: (what it waits for, on which stage)
    before_workers = sampler.sample()
    port = free_port()
    procs = []
    cfg_dict = {n: getattr(cfg, n) for n in RGCConfig.model_fields}
    for w in range(W):
        queues = {"fwd_in": fwd[w - 1] if w > 0 else None,
                  "fwd_out": fwd[w] if w < W - 1 else None,
                  "bwd_in": bwd[w] if bwd and w < W - 1 else None,
                  "bwd_out": bwd[w - 1] if bwd and w > 0 else None}
        p = ctx.Process(
            target=_stage_worker, name=f"rgc-worker-{w}",
            args=(w, cfg_dict, seed, port, ck_bytes, end, train_data if w == 0 else None,
                  queues, results, stop, finish, go, status, fault_spec()),
            daemon=True)
        p.start()
        procs.append(p)
    placement = cfg.placement
    ready = started = 0
    runtimes = Memory()
    done_workers = 0
    step_reports: dict[int, dict[int, float]] = {}
    step_timing: dict[int, dict[int, dict[str, float]]] = {}
    states: dict[int, dict[int, dict]] = {}
    final_parts: dict[int, dict] | None = None
    clock = Clock()
    last_t = 0.0
    last_msg = time.monotonic()
    # a worker times out on its own after worker_timeout_s; the parent waits a margin longer
    silence_limit = cfg.worker_timeout_s + 60.0
    try:
        while done_workers < W:
            try:
                msg = results.get(timeout=POLL_S)
                last_msg = time.monotonic()
            except queue_mod.Empty:
                for w, p in enumerate(procs):
                    if p.exitcode is not None and p.exitcode != 0:
                        raise StageWorkerError(
                            placement[w][0], f"worker {w} (stages {placement[w]}) exited with "
                            f"code {p.exitcode} without a traceback (killed or crashed)", w
                        ) from None
                if time.monotonic() - last_msg > silence_limit:
                    raise TimeoutError(f"no RGC worker reported for {silence_limit:.0f} s "
                                       "(rgc.worker_timeout_s + 60 s); stopped the run"
                                       ) from None
                continue
            kind, w = msg[0], msg[1]
            if kind == "error":
                raise _failure(msg, status, placement, cfg.worker_timeout_s)
            if kind == "started":
                started += 1
                if started == W:
                    runtimes = sampler.sample() - before_workers
                    go.set()
            elif kind == "ready":
                ready += 1
                if ready == W:
                    clock.start()
                    last_t = time.perf_counter()
            elif kind == "step":
                step, losses, timing = msg[2], msg[3], msg[5]
                step_reports.setdefault(step, {}).update(losses)
                step_timing.setdefault(step, {})[w] = timing
                if len(step_timing[step]) == W:
                    now = time.perf_counter()
                    stage_losses = [step_reports[step][k] for k in range(K)]
                    timings = step_timing.pop(step)
                    rec.log({"step": step, "loss": stage_losses[-1],
                             "stage_losses": stage_losses, "lr": lr_at(cfg, step),
                             "step_time_s": now - last_t,
                             "worker_wait_s": [timings[v]["wait_s"] for v in range(W)],
                             "worker_consensus_s": [timings[v]["consensus_s"]
                                                    for v in range(W)]})
                    last_t = now
                    del step_reports[step]
            elif kind == "state":
                done_step = msg[2]
                states.setdefault(done_step, {})[w] = state_from_bytes(msg[3])
                if len(states[done_step]) == W:
                    parts = states.pop(done_step)
                    # the clock keeps running: the workers keep computing meanwhile
                    _on_state(cfg, parts, done_step, out_dir, val_data, rec, template, identity)
                    if done_step == end:
                        final_parts = parts
            elif kind == "done":
                done_workers += 1
        clock.pause()
    except BaseException:
        stop.set()
        finish.set()
        _shutdown(procs, grace_s=2.0)  # the others stop within POLL_S; a hung one is killed
        sampler.stop()
        raise
    finish.set()
    _shutdown(procs, grace_s=30.0)
    check(final_parts is not None, "async run", "no final state", "workers must report a state")
    model_state, _, _, _ = _assemble(cfg, final_parts)  # type: ignore[arg-type]
    template.load_state_dict(model_state)
    final_state = {n: v.detach().clone() for n, v in template.state_dict().items()}
    if end < cfg.steps:
        n_tokens = (end - start) * cfg.batch_size * cfg.context
        tokens_per_s = n_tokens / clock.total if clock.total > 0 else 0.0
        return TrainResult("async", tokens_per_s, sampler.stop().rss, float("nan"), [], {},
                           rec.records, final_state, out_dir)
    eval_losses = evaluate(template, val_data, cfg)
    peak = sampler.stop()
    summary = rec.finish(cfg, make_summary(cfg, "async", name, corpus, seed, eval_losses, peak,
                                           template.num_parameters(), rec.records, start,
                                           clock.total, sampler.max_processes,
                                           runtimes), eval_losses)
    return TrainResult("async", summary["tokens_per_s"], peak.rss, summary["final_bpb"],
                       eval_losses, summary, rec.records, final_state, out_dir)


def _failure(msg: tuple, status: Any, placement: list[list[int]], timeout_s: float
             ) -> StageWorkerError:
    """The error to raise for a worker's ``("error", w, stage, traceback, peer)`` report. A
    timeout waiting on stage ``peer`` blames the stage at the end of the chain of waiting
    workers (the first to time out is often the farthest from the stage that stopped)."""
    _, w, stage, detail, peer = msg
    if peer is None:
        return StageWorkerError(stage, detail, w)
    stalled, chain = _stalled_stage(status, placement, peer)
    worker = next(v for v, ks in enumerate(placement) if stalled in ks)
    walk = " <- ".join(f"stage {k}" for k in [stage, *chain])
    return StageWorkerError(stalled, f"stage {stalled} (worker {worker}) made no progress for "
                            f"{timeout_s:.0f} s (rgc.worker_timeout_s); waits: {walk}; the "
                            f"first report, from stage {stage}:\n{detail}", worker)


def _on_state(cfg: RGCConfig, parts: dict[int, dict], done: int, out_dir: Path | None,
              val_data: np.ndarray, rec: Recorder, template: torch.nn.Module,
              identity: dict) -> None:
    """All W workers reported their state after step ``done``: checkpoint and/or evaluate."""
    model_state, optims, gen_state, pending = _assemble(cfg, parts)
    if out_dir is not None and cfg.checkpoint_every and (
            done % cfg.checkpoint_every == 0 or done == cfg.steps):
        save_state(out_dir, identity, done, model_state, optims, gen_state, pending)
    if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
        template.load_state_dict(model_state)
        rec.log({"step": done - 1, "eval_bpb": bits_per_byte(evaluate(template, val_data,
                                                                         cfg))})


def _shutdown(procs: list, grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


def _finish_without_steps(cfg: RGCConfig, template: torch.nn.Module, out_dir: Path | None,
                          val_data: np.ndarray, rec: Recorder, start: int,
                          sampler: MemorySampler, corpus: str, name: str | None, seed: int,
                          identity: dict) -> TrainResult:
    """Resumed at the last step already: reload the checkpoint, re-evaluate, and write the
    summary from the recorded step times."""
    ck = load_state(out_dir, identity)
    if ck is not None:
        template.load_state_dict(ck["model"])
    eval_losses = evaluate(template, val_data, cfg)
    peak = sampler.stop()
    summary = rec.finish(cfg, make_summary(cfg, "async", name, corpus, seed, eval_losses, peak,
                                           template.num_parameters(), rec.records, start, 0.0,
                                           sampler.max_processes), eval_losses)
    return TrainResult("async", summary["tokens_per_s"], peak.rss, summary["final_bpb"],
                       eval_losses, summary, rec.records,
                       {n: v.clone() for n, v in template.state_dict().items()}, out_dir)
