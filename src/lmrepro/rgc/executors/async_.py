"""Asynchronous RGC executor: the stages on worker processes (docs/rgc.md).

Why processes and not threads: failure isolation, an allocator and a thread count per worker,
and the paper's metric, the memory of the whole process tree (the thread alternative is measured
by ``bench/bench_rgc.py --design``). See docs/rgc.md, "Deviations and decisions".

Placement: the K stages run on W <= K worker processes, worker w holding consecutive stages
(``RGCConfig.placement``) with ``threads[w]`` intra-op threads, so a 4-stage model can
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
  (:func:`lmrepro.rgc.core.stages.stage_backward`), adds its stages' own readout gradients,
  backpropagates through its stages (the kept activations) and sends the gradients that
  continue to the previous worker. H = K is global backprop of the sum of the local losses;
* consensus: one gloo ``all_reduce`` (sum, then / K) of the flattened decoder gradients over
  127.0.0.1 per step among the W workers; every replica applies the same mean gradient, in the
  same step (``consensus_staleness`` 0) or s steps later (bounded staleness s: the all-reduce
  runs in the background meanwhile);
* the parent only collects per-step losses, states for checkpoints, errors, and at the end each
  worker's timestamped compute events (:mod:`lmrepro.rgc.executors.events`, ``events.json``).

Every activation and gradient between workers is tagged with its step, micro-batch and sending
stage, and the receiver checks the tag against what it expects
(:func:`lmrepro.rgc.executors.wire.untag`).

A worker that raises sends its traceback to the parent, which stops every worker and raises
:class:`StageWorkerError` naming the stage that was running; a worker that dies without a word
(killed, segfault) is noticed from its exit code. Every queue get/put (forward activations and
backward gradients alike) and the collective have timeouts (``config.timeout_s``); a
timeout names the stage that did not deliver, so nothing hangs and the culprit is named.
"""

from __future__ import annotations

import queue as queue_mod
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from lmrepro.checkpoints import Checkpoints
from lmrepro.distributed import free_port
from lmrepro.errors import check
from lmrepro.evaluation import bits_per_byte
from lmrepro.harness import Run
from lmrepro.lifetime import fault_spec
from lmrepro.memory import Memory
from lmrepro.memory_phases import END, TRAINING, START
from lmrepro.model import ByteTransformer
from lmrepro.rgc.executors import events as events_mod
from lmrepro.rgc.core.checkpoint import checkpoint_state, state_from_bytes, state_to_bytes
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.core.recipe import build_model, evaluate
from lmrepro.rgc.core.result import TrainResult, finish
from lmrepro.rgc.core.run_memory import in_evaluation, run_sampler, set_phase
from lmrepro.rgc.core.run_spec import RunSpec, harness
from lmrepro.rgc.executors.wire import (POLL_S, Failed, Finished, Message, PartSaved, Ready,
                                        Started, StateAfter, StepDone, WorkerEvents, by_reference,
                                        stalled_stage)
from lmrepro.rgc.executors.worker import WorkerArgs
from lmrepro.rgc.executors.worker_process import _stage_worker
from lmrepro.rgc.executors.worker_stages import worker_state_names


class StageWorkerError(RuntimeError):
    """A worker failed; ``stage`` is the stage it was running (for a silent death, the first
    stage of the worker), ``worker`` the process; the message carries the traceback."""

    def __init__(self, stage: int, detail: str, worker: int | None = None) -> None:
        self.stage = stage
        self.worker = worker
        self.detail = detail
        where = f" (worker {worker})" if worker is not None else ""
        super().__init__(f"RGC async stage {stage} failed{where}:\n{detail}")


def _mp_context() -> Any:
    """``forkserver`` with torch and the worker preloaded: the server imports torch once per
    parent process and forks each stage from a single-threaded process (no inherited OpenMP pool,
    no repeated multi-second import). Falls back to ``spawn`` where forkserver does not exist."""
    try:
        ctx = mp.get_context("forkserver")
    except ValueError:
        return mp.get_context("spawn")
    # torch._dynamo is imported by the first optimizer construction (~3 s per process)
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.optim", "torch.distributed",
                                "lmrepro.rgc.executors.worker_process"])
    return ctx


@dataclass
class _Pipeline:
    """The worker processes of one run and what the parent shares with them."""

    procs: list[Any]
    results: Any
    stop: Any
    finish: Any
    go: Any
    status: Any
    # the neighbours' queues: a started process drops its arguments, and a queue the parent no
    # longer holds is unlinked before a forkserver child unpickles it
    links: list[Any] = field(default_factory=list)


def worker_start(cfg: RGCConfig, w: int, model: ByteTransformer,
                 ck: dict[str, Any] | None) -> dict[str, Any]:
    """Worker ``w``'s part of the start state: the weights of its stages and of the decoder
    (from the parent's model: built from the seed, or the checkpoint's) and, when resuming
    ``ck``, its optimizers, the decoder's, the pending consensus, the generator (stage 0's
    worker) and what it had in flight. A worker never receives the other stages' tensors."""
    stages = cfg.placement[w]
    state = model.state_dict()
    part: dict[str, Any] = {"model": {n: state[n]
                                      for n in worker_state_names(model, cfg, stages)}}
    if ck is not None:
        part.update({
            "step": ck["step"], "gen_state": ck["gen_state"] if 0 in stages else None,
            "optims": {key: ck["optims"][key] for key in
                       [*(f"stage{k}" for k in stages), "decoder"]},
            "pending_consensus": ck.get("pending_consensus", []),
            "in_flight": {"workers": {w: ck.get("in_flight", {}).get("workers", {}).get(w)}}})
    return part


def _start_workers(cfg: RGCConfig, spec: RunSpec, starts: list[bytes], end: int,
                   train_data: np.ndarray, kind: str, checkpoints: Checkpoints) -> _Pipeline:
    """Start the W workers, with bounded queues between neighbours (forward; backward for
    H > 1); each saves its own part of a checkpoint through the run's ``checkpoints``."""
    ctx = _mp_context()
    W, size = cfg.n_workers, cfg.queue_capacity
    fwd = [ctx.Queue(maxsize=size) for _ in range(W - 1)]
    bwd = [ctx.Queue(maxsize=size) for _ in range(W - 1)] if cfg.horizon > 1 else []
    pipe = _Pipeline([], ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Event(),
                     ctx.Array("i", 2 * W, lock=False),  # per worker: (waits for, on which stage)
                     [*fwd, *bwd])
    port = free_port()
    cfg_dict = {n: getattr(cfg, n) for n in RGCConfig.model_fields}
    for w in range(W):
        queues = {"fwd_in": fwd[w - 1] if w > 0 else None,
                  "fwd_out": fwd[w] if w < W - 1 else None,
                  "bwd_in": bwd[w] if bwd and w < W - 1 else None,
                  "bwd_out": bwd[w - 1] if bwd and w > 0 else None}
        args = WorkerArgs(w, cfg_dict, spec.seed, port, starts[w], end,
                          by_reference(train_data) if w == 0 else None, checkpoints, queues,
                          pipe.results, pipe.stop, pipe.finish, pipe.go, pipe.status,
                          fault_spec(), kind)
        p = ctx.Process(target=_stage_worker, name=f"rgc-worker-{w}", args=(args,), daemon=True)
        p.start()
        pipe.procs.append(p)
    return pipe


def train_async(cfg: RGCConfig, spec: RunSpec, train_data: np.ndarray, val_data: np.ndarray,
                kind: str = "rgc") -> TrainResult:
    """Run the async executor; see :func:`lmrepro.rgc.train`. The stage workers' fault points
    (tests only) are :data:`lmrepro.rgc.executors.faults.FAULT_POINT`.
    ``kind="pipelined_backprop"``: the same workers train global backprop
    (:mod:`lmrepro.rgc.executors.pipelined`).

    Memory (docs/rgc.md, "Memory"): the parent's model (built from the seed or the checkpoint)
    and the start states exist in the start-up phase only; while the workers train the parent
    holds no model (an evaluation rebuilds one, in the evaluation phase), and the final
    hand-over is the end-of-run phase."""
    template: ByteTransformer | None = build_model(cfg, spec.seed)
    ckpt: list[dict[str, Any]] = []

    with harness(cfg, spec, run_sampler(START)) as run:
        def restore(ck: dict[str, Any]) -> None:
            if "parts" in ck:        # each worker saved its own part beside the checkpoint
                ck = {**_assemble(cfg, {w: run.checkpoints.load_part(int(ck["step"]), w)
                                        for w in range(int(ck["parts"]))}), "step": ck["step"]}
            assert template is not None
            template.load_state_dict(ck["model"])
            ckpt.append(ck)

        end = spec.end(cfg, run.resume(restore))
        if end == run.start:
            assert template is not None
            return finish(cfg, spec, run, template, val_data, end)
        before_workers = run.sampler.sample()
        assert template is not None
        starts = [state_to_bytes(worker_start(cfg, w, template, ckpt[0] if ckpt else None))
                  for w in range(cfg.n_workers)]
        ckpt.clear()
        template = None          # the evaluation copy: rebuilt when an evaluation needs it
        pipe = _start_workers(cfg, spec, starts, end, train_data, kind, run.checkpoints)
        del starts
        set_phase(run, TRAINING)
        parent = _Parent(cfg, run, pipe, spec.seed, val_data, end, before_workers)
        try:
            parent.collect()
        except BaseException:
            pipe.stop.set()
            pipe.finish.set()
            # the others stop within POLL_S; a hung one is killed
            _shutdown(pipe.procs, grace_s=2.0)
            raise
        pipe.finish.set()
        _shutdown(pipe.procs, grace_s=30.0)
        check(parent.final is not None, "async run", "no final state",
              "workers must report a state")
        assert parent.final is not None
        parent.load_weights(parent.final)
        if run.checkpoints.on_disk:
            run.checkpoints.drop_unpublished(end)
        events = events_mod.collect(parent.events)
        if spec.out_dir is not None:
            events_mod.write(spec.out_dir, events, run.start)
        result = finish(cfg, spec, run, parent.model(), val_data, end, parent.runtimes)
        result.events = events
        return result


@dataclass
class _Parent:
    """The parent's side of the protocol: it collects the workers' messages, logs each step
    once every worker reported it, and checkpoints and evaluates the states they send.

    The training clock runs from the moment every worker is ready to the last step's report:
    the workers never wait for the parent, so its checkpoint writes and evaluations overlap the
    training (their time is counted apart, as checkpoint time)."""

    cfg: RGCConfig
    run: Run
    pipe: _Pipeline
    seed: int
    val_data: np.ndarray
    end: int
    before_workers: Memory
    #: the evaluation copy: built when an evaluation or the end needs it, dropped after an
    #: evaluation between steps (its memory is the evaluation phase's, not training's)
    template: ByteTransformer | None = None
    runtimes: Memory = field(default_factory=Memory)
    final: dict[int, dict] | int | None = None   # the last state: its parts, or their step
    counts: dict[type, int] = field(default_factory=dict)
    saved: dict[int, dict[int, float]] = field(default_factory=dict)   # done -> worker -> s
    save_s: dict[int, float] = field(default_factory=dict)    # done -> the slowest save
    steps: dict[int, dict[int, StepDone]] = field(default_factory=dict)
    states: dict[int, dict[int, dict]] = field(default_factory=dict)
    events: dict[int, Any] = field(default_factory=dict)     # worker -> its flat event array
    last_t: float = 0.0

    def collect(self) -> None:
        """Handle messages until every worker finished."""
        W = self.cfg.n_workers
        last_msg = time.monotonic()
        # a worker times out on its own after timeout_s; the parent waits a margin longer
        silence_limit = self.cfg.timeout_s + 60.0
        while self.counts.get(Finished, 0) < W:
            try:
                msg = self.pipe.results.get(timeout=POLL_S)
                last_msg = time.monotonic()
            except queue_mod.Empty:
                self._check_alive()
                if time.monotonic() - last_msg > silence_limit:
                    raise TimeoutError(f"no RGC worker reported for {silence_limit:.0f} s "
                                       "(rgc.timeout_s + 60 s); stopped the run"
                                       ) from None
                continue
            self.handle(msg)

    def _check_alive(self) -> None:
        for w, p in enumerate(self.pipe.procs):
            if p.exitcode is not None and p.exitcode != 0:
                stages = self.cfg.placement[w]
                raise StageWorkerError(stages[0], f"worker {w} (stages {stages}) exited with "
                                       f"code {p.exitcode} without a traceback (killed or "
                                       "crashed)", w) from None

    def handle(self, msg: Message) -> None:
        W = self.cfg.n_workers
        if isinstance(msg, Failed):
            raise _failure(msg, self.pipe.status, self.cfg.placement, self.cfg.timeout_s)
        self.counts[type(msg)] = self.counts.get(type(msg), 0) + 1
        if isinstance(msg, Started) and self.counts[Started] == W:
            self.runtimes = self.run.sampler.sample() - self.before_workers
            self.pipe.go.set()
        elif isinstance(msg, Ready) and self.counts[Ready] == W:
            self.last_t = time.perf_counter()
        elif isinstance(msg, StepDone):
            self.steps.setdefault(msg.step, {})[msg.worker] = msg
            if len(self.steps[msg.step]) == W:
                self._log_step(msg.step, self.steps.pop(msg.step))
        elif isinstance(msg, StateAfter):
            self.states.setdefault(msg.done, {})[msg.worker] = state_from_bytes(msg.payload)
            if len(self.states[msg.done]) == W:
                self._on_state(msg.done, self.states.pop(msg.done))
        elif isinstance(msg, WorkerEvents):
            self.events[msg.worker] = msg.rows
        elif isinstance(msg, PartSaved):
            self.saved.setdefault(msg.done, {})[msg.worker] = msg.seconds
            if len(self.saved[msg.done]) == W:
                seconds = self.saved.pop(msg.done)
                # the workers saved in parallel, before their next step: checkpoint time, not
                # training time (taken off that step's clock in _log_step)
                self.save_s[msg.done] = max(seconds.values())
                self._on_parts(msg.done)

    def _log_step(self, step: int, reports: dict[int, StepDone]) -> None:
        """Every worker finished ``step``: its record, timed from the previous step's end, less
        the time the workers spent saving their parts before it (checkpoint time)."""
        now = time.perf_counter()
        saving = min(self.save_s.pop(step, 0.0), max(0.0, now - self.last_t))
        self.run.checkpoint_time_s += saving
        self.last_t += saving
        losses = {k: v for r in reports.values() for k, v in r.losses.items()}
        # RGC: every stage's local loss; pipelined backprop: the last stage's, the model's own
        stage_losses = [losses[k] for k in sorted(losses)]
        workers = [reports[w] for w in range(self.cfg.n_workers)]
        self.run.add_time(now - self.last_t)
        self.run.log_step(step, self.run.lr(step), now - self.last_t, {
            "loss": stage_losses[-1], "stage_losses": stage_losses,
            "worker_wait_s": [r.wait_s for r in workers],
            "worker_consensus_s": [r.consensus_s for r in workers]})
        self.last_t = now
        if step + 1 == self.end:      # the last step: what follows is the hand-over
            set_phase(self.run, END)

    def model(self) -> ByteTransformer:
        """The parent's model (the evaluation copy), built from the seed when it has none; its
        weights are loaded by the caller."""
        if self.template is None:
            self.template = build_model(self.cfg, self.seed)
        return self.template

    def load_weights(self, parts: dict[int, dict] | int) -> None:
        """The template model's weights from the workers' parts: sent (a dict), or saved after
        step ``parts`` (read one part at a time, so the parent never holds them all)."""
        model = self.model()
        if isinstance(parts, dict):
            model.load_state_dict(_assemble(self.cfg, parts)["model"])
            return
        for w in range(self.cfg.n_workers):
            part = self.run.checkpoints.load_part(parts, w)
            model.load_state_dict({**part["params"], **part.get("decoder", {})}, strict=False)
            del part

    def _on_parts(self, done: int) -> None:
        """All W workers saved their parts after step ``done``: evaluate and/or checkpoint (the
        checkpoint's own file names its parts)."""
        def evaluate_state() -> float:
            self.load_weights(done)
            bpb = bits_per_byte(evaluate(self.model(), self.val_data, self.cfg))
            self.template = None
            return bpb

        self.run.after_step(done, lambda: {"parts": self.cfg.n_workers},
                            in_evaluation(self.run.sampler, evaluate_state))
        if done == self.end:      # after the training clock: the hand-over's own time
            self.run.checkpoint_time_s += self.save_s.pop(done, 0.0)
            self.final = done

    def _on_state(self, done: int, parts: dict[int, dict]) -> None:
        """All W workers reported their state after step ``done``: evaluate and/or checkpoint."""
        state = _assemble(self.cfg, parts)

        def evaluate_state() -> float:
            self.model().load_state_dict(state["model"])
            bpb = bits_per_byte(evaluate(self.model(), self.val_data, self.cfg))
            self.template = None
            return bpb

        self.run.after_step(done, lambda: state, in_evaluation(self.run.sampler, evaluate_state))
        if done == self.end:
            self.final = parts


def _failure(msg: Failed, status: Any, placement: list[list[int]], timeout_s: float
             ) -> StageWorkerError:
    """The error to raise for a worker's :class:`Failed` report. A timeout waiting on stage
    ``peer`` blames the stage at the end of the chain of waiting workers (the first to time out
    is often the farthest from the stage that stopped)."""
    if msg.peer is None:
        return StageWorkerError(msg.stage, msg.detail, msg.worker)
    stalled, chain = stalled_stage(status, placement, msg.peer)
    worker = next(v for v, ks in enumerate(placement) if stalled in ks)
    walk = " <- ".join(f"stage {k}" for k in [msg.stage, *chain])
    return StageWorkerError(stalled, f"stage {stalled} (worker {worker}) made no progress for "
                            f"{timeout_s:.0f} s (rgc.timeout_s); waits: {walk}; the "
                            f"first report, from stage {msg.stage}:\n{msg.detail}", worker)


def _assemble(cfg: RGCConfig, parts: dict[int, dict]) -> dict[str, Any]:
    """The checkpoint state (:func:`lmrepro.rgc.core.checkpoint.checkpoint_state`) from the W
    workers' payloads."""
    model_state: dict[str, torch.Tensor] = {}
    optims: dict[str, dict] = {}
    for w in range(cfg.n_workers):
        model_state.update(parts[w]["params"])
        optims.update(parts[w]["opt_stages"])
    # RGC: worker 0 holds the decoder's consensus replica; pipelined backprop: the last worker
    dec = next(parts[w] for w in range(cfg.n_workers) if "decoder" in parts[w])
    model_state.update(dec["decoder"])
    optims["decoder"] = dec["opt_dec"]
    in_flight = {w: parts[w]["in_flight"] for w in range(cfg.n_workers)
                 if "in_flight" in parts[w]}
    return checkpoint_state(model_state, optims, parts[0]["gen_state"],
                            parts[0]["pending_consensus"],
                            {"workers": in_flight} if in_flight else None)


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
