"""The one run harness: everything a training run does around its step.

A trainer builds its model and optimizers, then hands the harness its *step* (one optimisation
step at a given learning rate, returning what it logs) and its *state* (what a checkpoint holds).
The harness owns the rest, the same for every trainer:

* the run directory: one writer (:func:`lmrepro.runlock.writer_lock`, taken by
  ``with Run(...)``), and its checkpoints (:attr:`Run.checkpoints`, the run's
  :class:`lmrepro.checkpoints.Checkpoints`: its identity, the checkpoint cadence, where the files
  go; a checkpoint of another configuration refused);
* resume: the last complete checkpoint handed to the trainer's ``restore``, ``metrics.jsonl`` cut
  back to its step (:func:`lmrepro.results.truncate_metrics`), the training time and peak memory
  of the invocations before carried on;
* the warm-up + cosine learning-rate schedule (:func:`lmrepro.evaluation.cosine_lr`);
* the cadences (:class:`Cadence`): which steps are logged, evaluated, checkpointed;
* timing: the training clock counts the steps only; checkpoint writes and evaluations are
  outside it, and checkpoint writes are counted apart (``RunSummary.checkpoint_time_s``);
* ``metrics.jsonl``, ``eval_losses.json`` and the :class:`lmrepro.results.RunSummary`, whose
  timing, token and resume fields it fills in.

Single-process and data-parallel trainers let :meth:`Run.train` drive the loop; a pipelined
executor whose steps run elsewhere (worker processes) reports them with :meth:`Run.log_step`,
:meth:`Run.add_time` and :meth:`Run.save`. Without a run directory (``out_dir=None``) nothing is
written and nothing resumes; the records stay in memory (:attr:`Run.records`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmrepro.checkpoints import Checkpoints
from lmrepro.evaluation import cosine_lr, wsd_lr
from lmrepro.io import append_jsonl
from lmrepro.memory import Memory, MemorySampler
from lmrepro.results import (METRICS, SUMMARY, RunSummary, step_time_std, truncate_metrics,
                             write_eval_losses, write_summary)
from lmrepro.runlock import writer_lock

#: what a step returns: at least ``loss`` (nats), then anything else it logs for the step
StepFn = Callable[[int, float], dict[str, Any]]


class Diverged(Exception):
    """Raised by a step whose loss or gradient stopped being finite (nothing was updated): the
    harness logs the step with its time and ``diverged``, and stops the run there."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def utc_now() -> str:
    """Now in UTC, ISO 8601 to the second (a summary's ``finished_at``)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

@dataclass(frozen=True)
class Schedule:
    """Linear warm-up to ``lr``, then ``kind``: cosine decay to ``min_lr_ratio * lr`` at
    ``steps`` (:func:`lmrepro.evaluation.cosine_lr`), or constant with a linear decay over the
    last ``decay_fraction`` of the run (:func:`lmrepro.evaluation.wsd_lr`)."""

    steps: int
    warmup_steps: int
    lr: float
    min_lr_ratio: float
    kind: str = "cosine"
    decay_fraction: float = 0.1

    def __call__(self, step: int) -> float:
        if self.kind == "wsd":
            return wsd_lr(step, self.steps, self.warmup_steps, self.lr, self.min_lr_ratio,
                          self.decay_fraction)
        return cosine_lr(step, self.steps, self.warmup_steps, self.lr, self.min_lr_ratio)

    @classmethod
    def of(cls, cfg: Any, lr: float) -> Schedule:
        """The schedule a :class:`lmrepro.evaluation.TrainingConfig` declares, peaking at ``lr``."""
        return cls(cfg.steps, cfg.warmup_steps, lr, cfg.min_lr_ratio, cfg.lr_schedule,
                   cfg.decay_fraction)


@dataclass(frozen=True)
class Cadence:
    """Which steps are logged, evaluated and checkpointed (``done`` counts completed steps).

    A checkpoint every ``checkpoint_every`` steps before the last (0: none), and after the last
    when ``checkpoint_last`` (the run's :class:`~lmrepro.checkpoints.Checkpoints` answers when
    one is due); an evaluation every ``eval_every`` steps before the last (0: none; the final
    model is evaluated by the trainer) and after the step counts in ``eval_at``; a step record
    every ``log_every`` steps and for the last step; a checkpoint kept out of the rotation after
    each step count in ``keep_at`` (:class:`~lmrepro.checkpoints.Checkpoints`' ``keep``)."""

    steps: int
    checkpoint_every: int = 0
    checkpoint_last: bool = False
    eval_every: int = 0
    log_every: int = 1
    eval_at: frozenset[int] = frozenset()
    keep_at: frozenset[int] = frozenset()

    def eval_due(self, done: int) -> bool:
        """Every ``eval_every`` steps, and after each count of steps in ``eval_at``, before
        the last (the trainer evaluates the final model)."""
        if done >= self.steps:
            return False
        return done in self.eval_at or (bool(self.eval_every) and done % self.eval_every == 0)

    def log_due(self, step: int) -> bool:
        return step % self.log_every == 0 or step + 1 == self.steps


@dataclass(frozen=True)
class Place:
    """Where this process stands in the run: its rank among ``world_size`` data-parallel ranks
    (rank 0 writes the run's files) and the barrier every rank passes between saving its part
    of a checkpoint and rank 0 publishing it."""

    rank: int = 0
    world_size: int = 1
    barrier: Callable[[str], None] | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class Run:
    """One training run's harness (see the module's docstring); use it as a context manager.

    ``identity`` is what a checkpoint must share with the run that resumes it (it and the
    cadence's checkpoints make :attr:`checkpoints`); ``tokens_per_step`` counts every rank's
    tokens; ``sampler`` measures this process (tree)."""

    def __init__(self, out_dir: str | Path | None, identity: dict[str, Any], schedule: Schedule,
                 cadence: Cadence, tokens_per_step: int, *, sampler: MemorySampler | None = None,
                 place: Place = Place()) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.lr, self.cadence = schedule, cadence
        self.checkpoints = Checkpoints(self.out_dir, identity, cadence.steps,
                                       cadence.checkpoint_every, cadence.checkpoint_last,
                                       place.world_size, cadence.keep_at)
        self.tokens_per_step, self.place = tokens_per_step, place
        self.sampler = sampler if sampler is not None else MemorySampler()
        self.records: list[dict[str, Any]] = []
        self.start = 0                 # the step this invocation resumed from
        self.done = 0                  # steps completed so far (all invocations)
        self.train_time_s = 0.0        # the steps' time (all invocations)
        self.checkpoint_time_s = 0.0   # checkpoint writes (all invocations)
        self.resumed_peak = Memory()   # peak memory of the invocations before this one
        self._stack = ExitStack()

    # -- the run directory -----------------------------------------------------------------------
    def __enter__(self) -> Run:
        if self.out_dir is not None:
            self._stack.enter_context(writer_lock(self.out_dir, enabled=self.place.is_main))
        self.sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.stop()
        self._stack.close()

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files (a run directory, rank 0)."""
        return self.out_dir is not None and self.place.is_main

    def finished(self) -> bool:
        """Whether the run directory already holds a summary (the run ended)."""
        return self.out_dir is not None and (self.out_dir / SUMMARY).exists()

    def resume(self, restore: Callable[[dict[str, Any]], None]) -> int:
        """Load the last complete checkpoint (if any) into the trainer through ``restore``, cut
        ``metrics.jsonl`` back to its step; returns the step to start from."""
        state = self.checkpoints.load(self.place.rank)
        if self.writes:
            assert self.out_dir is not None
            self.out_dir.mkdir(parents=True, exist_ok=True)
        if state is not None:
            restore(state)
            self.start = self.done = int(state["step"])
            self.resumed_peak = Memory(**state.get("peak_memory", {}))
            self.checkpoint_time_s = float(state.get("checkpoint_time_s", 0.0))
        if self.writes:
            assert self.out_dir is not None
            self.records = truncate_metrics(self.out_dir, self.start)
        if state is not None:
            # checkpoints written before the harness kept no clock: the logged step times then
            self.train_time_s = float(state.get("elapsed_s", sum(
                r["step_time_s"] for r in self.records if "loss" in r)))
        return self.start

    # -- records ---------------------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        """Append one record to ``metrics.jsonl`` (rank 0) and to :attr:`records`."""
        if not self.place.is_main:
            return
        self.records.append(record)
        if self.out_dir is not None:
            append_jsonl(self.out_dir / METRICS, record)

    def log_step(self, step: int, lr: float, seconds: float, out: dict[str, Any]) -> None:
        """The record of a trained step (when the cadence logs it)."""
        if self.cadence.log_due(step):
            self.log({"step": step, "loss": out["loss"], "lr": lr, "step_time_s": seconds,
                      **{k: v for k, v in out.items() if k != "loss"}})

    def add_time(self, seconds: float, steps: int = 1) -> None:
        """Count ``steps`` trained steps that took ``seconds`` on the training clock."""
        self.train_time_s += seconds
        self.done += steps

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, done: int, state: dict[str, Any]) -> None:
        """Checkpoint ``state`` after step ``done`` with the harness's clocks and peak memory;
        data-parallel: every rank its part, the barrier, then rank 0 publishes it. The time it
        takes counts as checkpoint time, never training time."""
        if self.out_dir is None:
            return
        t0 = time.perf_counter()
        self.checkpoints.commit(done, {
            **state, "elapsed_s": self.train_time_s, "checkpoint_time_s": self.checkpoint_time_s,
            "peak_memory": self.sampler.peak.peak(self.resumed_peak).to_dict()},
            self.place.rank, self.place.barrier)
        self.checkpoint_time_s += time.perf_counter() - t0

    # -- the loop --------------------------------------------------------------------------------
    def train(self, step: StepFn, state: Callable[[], dict[str, Any]],
              evaluate: Callable[[], float | dict[str, float]] | None = None, end: int | None = None
              ) -> int | None:
        """Train steps ``start .. end - 1`` (default: to the last): for each, the lr, the
        ``step`` timed on the training clock, its record, then the evaluation (``evaluate``
        returns bits per byte) and the checkpoint (``state()``) the cadences ask for. Returns the
        step that diverged (:class:`Diverged`), or None."""
        for i in range(self.start, self.cadence.steps if end is None else end):
            lr = self.lr(i)
            t0 = time.perf_counter()
            try:
                out = step(i, lr)
            except Diverged as err:
                seconds = time.perf_counter() - t0
                self.add_time(seconds)
                self.log({"step": i, "step_time_s": seconds, "diverged": err.why})
                return i
            seconds = time.perf_counter() - t0
            self.add_time(seconds)
            self.log_step(i, lr, seconds, out)
            self.after_step(i + 1, state, evaluate)
        return None

    def after_step(self, done: int, state: Callable[[], dict[str, Any]],
                   evaluate: Callable[[], float | dict[str, float]] | None) -> None:
        """The evaluation and the checkpoint due after step ``done``. ``evaluate`` returns the
        validation bits per byte, or a record of several (``eval_bpb``, ``test_bpb``)."""
        if evaluate is not None and self.cadence.eval_due(done):
            got = evaluate()
            self.log({"step": done - 1, **(got if isinstance(got, dict) else {"eval_bpb": got})})
        if self.checkpoints.due(done):
            self.save(done, state())

    # -- the summary -----------------------------------------------------------------------------
    def peak(self) -> Memory:
        """This process's (tree's) peak memory over the whole run, the sampler stopped."""
        return self.sampler.stop().peak(self.resumed_peak)

    def tokens_per_s(self) -> float:
        """Training throughput: the tokens of the steps timed over the training clock."""
        return max(self.done, 1) * self.tokens_per_step / max(self.train_time_s, 1e-12)

    def summary(self, fields: dict[str, Any], trained: int | None = None) -> RunSummary:
        """The :class:`RunSummary`: ``fields`` from the trainer (name, method, memory, details,
        ...), the rest from the harness: ``steps``, ``tokens`` (of the ``trained`` steps, by
        default all), throughput and step time over the training clock, their spread from the
        logged step times, the checkpoint time and the step resumed from."""
        trained = self.cadence.steps if trained is None else trained
        timed = max(self.done, 1)
        clock = self.train_time_s
        return RunSummary(**{
            "steps": self.cadence.steps, "tokens": trained * self.tokens_per_step,
            "tokens_per_s": self.tokens_per_s(),
            "mean_step_time_s": clock / timed, "train_time_s": clock,
            "step_time_std_s": step_time_std(self.records), "resumed_from_step": self.start,
            "checkpoint_time_s": self.checkpoint_time_s, "finished_at": utc_now(), **fields})

    def finish(self, summary: RunSummary, eval_losses: list[float] | None, batch_size: int,
               context: int, test_losses: list[float] | None = None) -> dict[str, Any]:
        """Write the final per-batch losses (validation, and test where given) and the summary
        (rank 0, with a run directory); returns the summary's JSON object."""
        if not self.writes:
            return summary.to_json()
        assert self.out_dir is not None
        if eval_losses is not None:
            write_eval_losses(self.out_dir, eval_losses, batch_size, context)
        if test_losses is not None:
            write_eval_losses(self.out_dir, test_losses, batch_size, context, split="test")
        return write_summary(self.out_dir, summary)
