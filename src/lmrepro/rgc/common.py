"""Pieces shared by the three executors: model and optimizers, data, checkpoints, run records.

Checkpoints use the package's one format (:mod:`lmrepro.results`) and the single-model state
layout of :func:`lmrepro.backprop.checkpoint_state` (a full ``ByteTransformer`` state dict, the
optimizer states by name, the batch generator's state); the RGC executors add their pending
gradients (:func:`checkpoint_state`).
"""

from __future__ import annotations

import io as _io
import os
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmrepro import backprop
from lmrepro.errors import check
from lmrepro.evaluation import bits_per_byte, evaluate_losses
from lmrepro.harness import Cadence, Run, Schedule
from lmrepro.lifetime import FAULT_ENV, armed_fault
from lmrepro.model import ByteTransformer
from lmrepro.optim.comm import flat_to_grads
from lmrepro.optim.groups import weight_decay_groups
from lmrepro.memory import Memory, MemorySampler, memory_fields
from lmrepro.memory_phases import END, EVALUATION, PHASES, START, TRAINING, PhasedSampler
from lmrepro.rgc.config import MULTI_PROCESS, RGCConfig
from lmrepro.rgc.roles import RGCMethod


def build_model(cfg: RGCConfig, seed: int) -> ByteTransformer:
    """The model, initialised from ``seed`` (identical in every process and executor)."""
    torch.manual_seed(seed)
    return ByteTransformer(cfg.model)


def make_adamw(model: ByteTransformer, params: Iterable[torch.nn.Parameter], cfg: RGCConfig
               ) -> torch.optim.AdamW:
    """AdamW over ``params`` (a part of ``model``) with the package's one weight-decay rule
    (:func:`lmrepro.optim.groups.weight_decay_groups`: matrices decay; 1-D tensors and the
    embeddings do not)."""
    return torch.optim.AdamW(weight_decay_groups(model, cfg.weight_decay, params), lr=cfg.lr,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=False)


def lr_at(cfg: RGCConfig, step: int) -> float:
    return Schedule.of(cfg, cfg.lr)(step)


def set_lr(optimizers: Iterable[torch.optim.Optimizer], lr: float) -> None:
    for opt in optimizers:
        for g in opt.param_groups:
            g["lr"] = lr


def batch_generator(seed: int) -> torch.Generator:
    """The training-batch generator (separate from the initialisation RNG)."""
    return torch.Generator().manual_seed(seed + 1_000_003)


def micro_batches(x: torch.Tensor, y: torch.Tensor, n: int
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(x.chunk(n, dim=0), y.chunk(n, dim=0)))


def synthetic_corpus(n_bytes: int = 200_000, seed: int = 0) -> np.ndarray:
    """Deterministic text-like bytes (words from a small vocabulary) for runs given no data."""
    rng = np.random.default_rng(seed)
    words = [w.encode() for w in (
        "the of and to in is was for on that with as by at from his her it an were are which "
        "this be or has had not but first one their its new after who they have two river "
        "stone garden winter morning letter music light").split()]
    out = bytearray()
    while len(out) < n_bytes:
        sentence = b" ".join(words[i] for i in rng.integers(0, len(words), rng.integers(4, 14)))
        out += sentence[:1].upper() + sentence[1:] + b". "
    return np.frombuffer(bytes(out[:n_bytes]), dtype=np.uint8).copy()


def check_data(name: str, data: Any, context: int) -> np.ndarray:
    check(isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1, name,
          type(data).__name__ if not isinstance(data, np.ndarray) else f"array {data.dtype}"
          f"{list(data.shape)}", "must be a 1-D numpy uint8 array of bytes")
    check(len(data) > context + 1, name, f"{len(data)} bytes",
          f"must hold more than context + 1 = {context + 1} bytes")
    return data


#: the fault points of an async stage worker (:func:`lmrepro.lifetime.fault_point`, tests only):
#: ``rgc-stage<k>@<step>`` at the start of a step, ``rgc-stage<k>-backward@<step>`` before stage
#: k's backward of the step's first micro-batch (H > 1); with ``-mislabel``
#: (:func:`lmrepro.lifetime.fault_armed`: a wrong value, not a failure) stage k tags the
#: activations (``rgc-stage<k>-mislabel@<step>``) or gradients
#: (``rgc-stage<k>-backward-mislabel@<step>``) it sends at that step with the next step
FAULT_POINT = re.compile(r"rgc-stage(\d+)(-backward)?(-mislabel)?@(\d+)")


def stage_fault_point(stage: int, step: int, backward: bool = False, mislabel: bool = False
                      ) -> str:
    """The name of stage ``stage``'s fault point at ``step`` (:data:`FAULT_POINT`)."""
    return (f"rgc-stage{stage}{'-backward' if backward else ''}{'-mislabel' if mislabel else ''}"
            f"@{step}")


def check_fault_point(config: RGCConfig, executor: str) -> None:
    """Refuse an RGC fault point a test armed (:func:`armed_fault`) that cannot fire here."""
    armed = armed_fault()
    if armed is None or not armed[0].startswith("rgc-"):
        return
    point = armed[0]
    match = FAULT_POINT.fullmatch(point)
    if match is None:
        check(False, FAULT_ENV, point, "an RGC fault point is rgc-stage<k>@<step>, "
              "rgc-stage<k>-backward@<step>, rgc-stage<k>-mislabel@<step> or "
              "rgc-stage<k>-backward-mislabel@<step>")
        return
    check(executor == "async", FAULT_ENV, point,
          "fault injection exists only for executor='async'")
    k = int(match[1])
    check(k < config.n_stages, FAULT_ENV, point,
          f"a fault point of a stage in [0, {config.n_stages})")
    check(not match[2] or config.horizon > 1, FAULT_ENV, point,
          "a backward-phase fault needs rgc.horizon > 1 (with H = 1 no gradient crosses "
          "workers)")
    if match[3]:
        senders = ([ws[0] for ws in config.placement[1:]] if match[2]
                   else [ws[-1] for ws in config.placement[:-1]])
        check(k in senders, FAULT_ENV, point, f"a mislabel fault of a stage that sends "
              f"{'gradients' if match[2] else 'activations'} to another worker: one of "
              f"{senders}")


def evaluate(model: ByteTransformer, val: np.ndarray, cfg: RGCConfig) -> list[float]:
    """Per-batch losses (nats) of the last stage's readout ``D(h_K)`` on the fixed eval set.

    The last stage's readout is the model's own forward pass (all blocks, then the decoder)."""
    was = model.training
    model.eval()
    try:
        return evaluate_losses(model, val, cfg.model.context, cfg.eval_batch_size,
                               cfg.eval_batches)
    finally:
        model.train(was)


# -- checkpoints ---------------------------------------------------------------------------------

def run_identity(cfg: RGCConfig, executor: str, seed: int) -> dict:
    """What a checkpoint must share with the run that resumes it: every setting but the eval
    cadence, the checkpoint cadence and the timeout."""
    free = ("eval_every", "checkpoint_every", "timeout_s")
    d = {k: v for k, v in cfg.to_dict().items() if k in RGCConfig.model_fields and k not in free}
    d["stages_per_worker"] = [len(g) for g in cfg.placement]
    d["threads"] = list(cfg.worker_threads)
    d["executor"] = executor
    d["seed"] = seed
    return d


def checkpoint_state(model_state: dict[str, torch.Tensor], optim_states: dict[str, dict],
                     gen_state: torch.Tensor, pending_consensus: list[torch.Tensor],
                     in_flight: dict[str, Any] | None = None) -> dict[str, Any]:
    """One checkpoint's state, the same for both RGC executors: the package's single-model layout
    (:func:`lmrepro.backprop.checkpoint_state`: weights, optimizer states by name ``stage<k>``
    and ``decoder``, the batch generator) with the consensus gradients not yet applied
    (``consensus_staleness`` > 0) and, for a run whose workers run ahead
    (:attr:`RGCConfig.runs_ahead`), the stage gradients still in flight: the sync executor's
    delayed gradients (``stage_grads``), the async workers' kept steps and unread messages
    (``workers``, by worker)."""
    return backprop.checkpoint_state(model_state, optim_states, gen_state,
                                     pending_consensus=list(pending_consensus),
                                     in_flight=in_flight or {})


def state_to_bytes(obj: Any) -> bytes:
    buf = _io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> Any:
    return torch.load(_io.BytesIO(data), map_location="cpu", weights_only=True)


# -- the decoder's consensus -------------------------------------------------------------------

class ConsensusQueue:
    """Consensus gradients of the decoder (the mean over stages of the readout gradients, as one
    flat tensor per step) waiting to be applied: with staleness s the gradient of step t is
    applied at step t + s (s = 0: the same step, in lockstep), so the first s steps make no
    decoder update. Every replica applies the same gradient in the same step, so the replicas
    stay identical. An entry may still be in flight (an asynchronous all-reduce): ``finish``
    completes it (waits, then divides by K) exactly once."""

    def __init__(self, params: list[torch.nn.Parameter], staleness: int,
                 pending: Iterable[torch.Tensor] = ()) -> None:
        self.params, self.staleness = params, staleness
        self._queue: deque[tuple[torch.Tensor, Callable[[], object] | None]] = deque(
            (t, None) for t in pending)

    def restore(self, pending: Iterable[torch.Tensor]) -> None:
        """Replace the queue with a checkpoint's pending gradients."""
        self._queue = deque((t, None) for t in pending)

    def push(self, flat: torch.Tensor, finish: Callable[[], object] | None = None) -> None:
        self._queue.append((flat, finish))

    def _complete(self, i: int) -> torch.Tensor:
        flat, finish = self._queue[i]
        if finish is not None:
            finish()
            self._queue[i] = (flat, None)
        return flat

    def pop_into_grads(self) -> bool:
        """Write the gradient due now into the parameters' ``.grad`` and return True; with none
        due yet, clear the gradients and return False (skip the decoder's optimizer step)."""
        if len(self._queue) <= self.staleness:
            for p in self.params:
                p.grad = None
            return False
        flat = self._complete(0)
        self._queue.popleft()
        flat_to_grads(flat, self.params)
        return True

    def state(self) -> list[torch.Tensor]:
        """The gradients still pending, completed (for a checkpoint)."""
        return [self._complete(i).clone() for i in range(len(self._queue))]


class StageGradientDelay:
    """The sync executor's copy of the async workers' running ahead: stage k's gradient,
    computed at step t, is applied at step t + ``delays[k]`` (:attr:`RGCConfig.
    stage_gradient_delays`); until the first one is due the stage has none (its AdamW skips
    it, as the async worker's does)."""

    def __init__(self, params: list[list[torch.nn.Parameter]], delays: list[int]) -> None:
        self.params, self.delays = params, delays
        self._lines: dict[int, deque[list[torch.Tensor | None]]] = {
            k: deque() for k, d in enumerate(delays) if d > 0}

    def shift(self) -> None:
        """Hold back each delayed stage's ``.grad`` and put the one due now in its place."""
        for k, line in self._lines.items():
            line.append([p.grad for p in self.params[k]])
            due = line.popleft() if len(line) > self.delays[k] else [None] * len(self.params[k])
            for p, g in zip(self.params[k], due):
                p.grad = g

    def state(self) -> dict[int, list[list[torch.Tensor | None]]]:
        return {k: [list(gs) for gs in line] for k, line in self._lines.items()}

    def restore(self, state: dict[int, list[list[torch.Tensor | None]]]) -> None:
        for k in self._lines:
            self._lines[k] = deque(list(gs) for gs in state.get(k, []))


# -- run records ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    """One run of :func:`lmrepro.rgc.train`: the executor, the seed, its names in the record,
    its run directory (None: nothing written) and where to stop early (``stop_after``)."""

    executor: str
    seed: int = 0
    corpus: str = "synthetic"
    name: str | None = None
    out_dir: Path | None = None
    stop_after: int | None = None
    #: the test split, scored once at the end beside the validation split (None: not scored);
    #: the length study tunes on the validation split and judges on this one
    test_data: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def method(self) -> RGCMethod:
        return (RGCMethod.BACKPROP if self.executor in ("backprop", "pipelined_backprop")
                else RGCMethod.RGC)

    def end(self, cfg: RGCConfig, start: int) -> int:
        """The step this invocation stops before."""
        return cfg.steps if self.stop_after is None else max(start, min(cfg.steps,
                                                                         self.stop_after))


def cadence(cfg: RGCConfig) -> Cadence:
    """Every step logged, a checkpoint every ``checkpoint_every`` steps and after the last (none
    at 0), an evaluation every ``eval_every`` steps before the last."""
    return Cadence(cfg.steps, cfg.checkpoint_every, checkpoint_last=bool(cfg.checkpoint_every),
                   eval_every=cfg.eval_every)


def harness(cfg: RGCConfig, spec: RunSpec, sampler: MemorySampler) -> Run:
    """The run's harness (:func:`cadence`, the identity of :func:`run_identity`)."""
    return Run(spec.out_dir, run_identity(cfg, spec.executor, spec.seed),
               Schedule.of(cfg, cfg.lr), cadence(cfg),
               cfg.batch_size * cfg.model.context, sampler=sampler)


@dataclass
class TrainResult:
    """What :func:`lmrepro.rgc.train` returns.

    ``tokens_per_s`` counts training tokens over the training clock (start-up, checkpoint writes
    and evaluations excluded); ``peak_rss_bytes`` is the sampled peak RSS of the whole process
    tree (PSS and USS in the summary); ``final_bpb`` the last stage's readout in bits per byte
    on the fixed eval set (NaN for a run stopped early); ``eval_losses`` per batch, nats.
    """

    executor: str
    tokens_per_s: float
    peak_rss_bytes: int
    final_bpb: float
    eval_losses: list[float]
    summary: dict[str, Any]
    metrics: list[dict] = field(default_factory=list)
    final_state: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    out_dir: Path | None = None
    #: async: every worker's compute events of this invocation (:mod:`lmrepro.rgc.events`)
    events: list[Any] = field(default_factory=list, repr=False)


#: what a run's ``peak_*_bytes`` count (``details.memory_attributed``; docs/rgc.md, "Memory")
ATTRIBUTED = (f"the {TRAINING} phase: the peak of the run's process tree while it trained (an "
              "async parent holds no model then). Not counted, each its own row in "
              f"details.memory_phases: {START} (async: the parent's model and the start states "
              f"it hands the workers), {EVALUATION} (evaluations between steps; async: the "
              f"parent's evaluation copy of the model) and {END} (the final state handed over "
              "and cloned, the final evaluation)")

#: whether this process was started for one run only (:func:`mark_fresh_process`)
_FRESH_PROCESS = [False]


def mark_fresh_process() -> None:
    """Record that this process was started to train one run (the suite's fresh process per
    run, :mod:`lmrepro.rgc.isolated`): its summary says so (``details.process_tree``)."""
    _FRESH_PROCESS[0] = True


def process_tree() -> dict[str, Any]:
    """The root of the measured process tree: this process, who started it, and whether it was
    started for this run alone (no earlier run's allocations or torch state in it)."""
    return {"root_pid": os.getpid(), "launcher_pid": os.getppid(),
            "fresh": _FRESH_PROCESS[0]}


def run_sampler(initial_phase: str = TRAINING) -> PhasedSampler:
    """The memory sampler of an RGC run (a peak per phase, :mod:`lmrepro.memory_phases`)."""
    return PhasedSampler(initial_phase=initial_phase)


def set_phase(run: Run, name: str) -> None:
    """Count ``run``'s memory samples from now on in phase ``name`` (where its sampler keeps
    phases)."""
    if isinstance(run.sampler, PhasedSampler):
        run.sampler.set_phase(name)


def in_evaluation(sampler: MemorySampler, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run in the sampler's evaluation phase (its memory its own row)."""
    def run() -> Any:
        if not isinstance(sampler, PhasedSampler):
            return fn()
        with sampler.phase(EVALUATION):
            return fn()
    return run


def attributed_peak(run: Run) -> Memory:
    """The run's peak as it counts (:data:`ATTRIBUTED`): the training phase's, with the peak of
    the invocations before a resume; the whole tree's where no phase was kept or sampled. Stops
    the sampler."""
    overall = run.peak()
    sampler = run.sampler
    training = (sampler.phase_peak(TRAINING) if isinstance(sampler, PhasedSampler) else None)
    return overall if training is None else training.peak(run.resumed_peak)


def memory_details(run: Run) -> dict[str, Any]:
    """The memory facts of ``details``: the peaks by phase, what the run's peak counts, the
    process tree, the peaks that do not depend on sampling (``memory_exact``)."""
    sampler = run.sampler
    phases = sampler.phases() if isinstance(sampler, PhasedSampler) else {}
    return {"memory_phases": {p: phases[p] for p in PHASES if p in phases},
            "memory_attributed": ATTRIBUTED if phases else "the whole process tree",
            "process_tree": process_tree(), "memory_exact": sampler.exact()}


def finish(cfg: RGCConfig, spec: RunSpec, run: Run, model: ByteTransformer, val_data: np.ndarray,
           end: int, worker_runtimes: Memory | None = None) -> TrainResult:
    """The end of an invocation: ``model`` holds the final parameters. Stopped early
    (``end`` < steps): the result without evaluation or summary. Otherwise the final
    evaluation, ``eval_losses.json`` and ``summary.json``. From here on the sampler counts the
    end of run phase (:data:`ATTRIBUTED`)."""
    set_phase(run, END)
    final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if end < cfg.steps:
        return TrainResult(spec.executor, run.tokens_per_s(), attributed_peak(run).rss,
                           float("nan"), [], {}, run.records, final_state, spec.out_dir)
    eval_losses = evaluate(model, val_data, cfg)
    test_losses = None if spec.test_data is None else evaluate(model, spec.test_data, cfg)
    peak = attributed_peak(run)
    fields = summary_fields(cfg, spec, eval_losses, peak, model.num_parameters(),
                            run.sampler.max_processes, worker_runtimes)
    fields["details"]["final_test_bpb"] = (None if test_losses is None
                                           else bits_per_byte(test_losses))
    # by phase; the peaks that do not depend on sampling (lmrepro.memory, "Exact peaks")
    fields["details"].update(memory_details(run))
    summary = run.finish(run.summary(fields), eval_losses, cfg.eval_batch_size,
                         cfg.model.context, test_losses)
    return TrainResult(spec.executor, summary["tokens_per_s"], peak.rss, summary["final_bpb"],
                       eval_losses, summary, run.records, final_state, spec.out_dir)


def summary_fields(cfg: RGCConfig, spec: RunSpec, eval_losses: list[float], peak: Memory,
                   n_params: int, memory_processes: int = 1,
                   worker_runtimes: Memory | None = None) -> dict[str, Any]:
    """The run's :class:`RunSummary` fields the harness does not fill in (timing, tokens and
    resume are its own)."""
    is_async, is_rgc = spec.executor in MULTI_PROCESS, spec.method == RGCMethod.RGC
    threads = cfg.async_threads if is_async else cfg.single_process_threads
    return {
        "name": spec.name or (f"rgc-{spec.executor}" if is_rgc else
                              spec.executor.replace("_", "-")),
        "method": spec.method, "executor": spec.executor, "corpus": spec.corpus,
        "seed": spec.seed, "final_bpb": bits_per_byte(eval_losses),
        **memory_fields(peak), "n_params": n_params,
        "processes": cfg.n_workers if is_async else 1, "threads": threads,
        "details": {"threads_per_process": list(cfg.worker_threads) if is_async
                    else [cfg.single_process_threads],
                    "placement": cfg.placement if is_async else [list(range(cfg.n_stages))],
                    "horizon": cfg.horizon if is_rgc else None,
                    "consensus_staleness": cfg.consensus_staleness if is_rgc else None,
                    # running ahead: steps by which each stage's gradients arrived late
                    "stage_gradient_delay": cfg.stage_gradient_delays if is_rgc else None,
                    "cores_declared": cfg.cores, "machine_cores": os.cpu_count(),
                    "oversubscribed": threads > (os.cpu_count() or 1),
                    "memory_processes": memory_processes,
                    # async: what the tree grew by when the workers had started, before any
                    # model or data existed in them (their torch runtimes, gloo included)
                    "worker_runtimes_memory": worker_runtimes.to_dict()
                    if worker_runtimes is not None else None},
        "config": run_config(cfg),
    }


def run_config(cfg: RGCConfig) -> dict[str, Any]:
    """The summary's ``config`` in every trainer's layout: ``model`` (the model's shape) and
    ``settings`` (the rest of the RGC configuration)."""
    settings = cfg.to_dict()
    return {"model": settings.pop("model"), "settings": settings}
