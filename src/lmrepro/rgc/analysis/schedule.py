"""The ideal step time of the async executor's schedule, from its pieces measured alone.

``bench/bench_rgc.py`` times each stage's compute alone (one process, the worker's thread
count, no other work on the machine) and predicts from it what the async pipeline could reach
on a placement: the workers run in parallel, each at its measured speed, and the only waits are
those the schedule itself imposes (:mod:`lmrepro.rgc.executors.async_`):

* forward phase: worker w starts micro-batch m when it is done with m-1 and worker w-1 has sent
  m's activation (the fill bubble: the first micro-batch crosses every worker);
* backward phase (H > 1): worker w backpropagates micro-batch m when it is done with m-1 and
  worker w+1 has sent m's gradient (the drain: the last gradient crosses every worker back);
  running ahead (H > 1 with s > 0, docs/rgc.md) the gradient it needs is the one worker w+1
  sent s steps earlier, and worker w has no backward before step s (W - 1 - w);
* after its last micro-batch a worker steps its stage optimizers, then joins the decoder's
  all-reduce; the all-reduce ends ``allreduce_s`` after the last worker joined, and every worker
  steps the decoder when the all-reduce of step t - s has ended (s = ``consensus_staleness``;
  s = 0 makes the all-reduce a barrier between steps, s > 0 lets a worker start the next step
  while others finish this one).

Transfers through the queues, Python overhead and the slow-down of workers sharing the memory
system are not in the model: they are what the measured/ideal ratio shows. With more intra-op
threads than cores the compute is stretched by ``threads / cores`` (the workers time-share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lmrepro.errors import check


@dataclass(frozen=True)
class WorkerTimes:
    """Seconds of one worker's compute, measured alone.

    Per micro-batch: ``pre_send`` (its stages' blocks forward, up to the activation it sends
    on), ``post_send`` (what follows in the forward phase: each stage's readout and, when no
    gradient comes back to it, its backward) and ``backward`` (the backward phase, H > 1). Per
    step: ``optimizer`` (its stages' AdamW steps) and ``decoder_optimizer``.
    """

    pre_send: float
    post_send: float
    backward: float = 0.0
    optimizer: float = 0.0
    decoder_optimizer: float = 0.0


def busy_step(w: WorkerTimes, micro_batches: int) -> float:
    """Compute of one worker in one step: its share of the work, with no waiting."""
    return micro_batches * (w.pre_send + w.post_send + w.backward) + w.optimizer \
        + w.decoder_optimizer


def simulate(workers: Sequence[WorkerTimes], micro_batches: int, backward_phase: bool,
             allreduce_s: float, staleness: int = 0, n_steps: int = 1) -> list[float]:
    """End time of each of ``n_steps`` steps (the last worker done with it) under the executor's
    schedule with the given compute times (module docstring). Starts at 0 with the pipeline
    empty."""
    W, M = len(workers), micro_batches
    check(W >= 1 and M >= 1 and n_steps >= 1 and staleness >= 0, "schedule",
          (W, M, n_steps, staleness), "must have >= 1 worker, micro-batch and step, staleness "
          ">= 0")
    free = [0.0] * W                      # when each worker is done with what it did last
    allreduce_end: list[float] = []
    ends = []
    ahead = backward_phase and staleness > 0
    lag = [staleness * (W - 1 - w) if ahead else 0 for w in range(W)]
    backs: list[list[list[float]]] = []   # per step, worker and micro-batch: gradient sent
    for step in range(n_steps):
        sent = [0.0] * W
        for _m in range(M):
            for w, t in enumerate(workers):
                start = max(free[w], sent[w - 1] if w > 0 else 0.0)
                sent[w] = start + t.pre_send
                free[w] = sent[w] + t.post_send
        back = [[0.0] * M for _ in range(W)]
        if backward_phase:
            for m in range(M):
                for w in [v for v in reversed(range(W)) if step >= lag[v]]:
                    above = (0.0 if w == W - 1 else
                             backs[step - staleness][w + 1][m] if ahead else back[w + 1][m])
                    free[w] = max(free[w], above) + workers[w].backward
                    back[w][m] = free[w]
        backs.append(back)
        for w, t in enumerate(workers):
            free[w] += t.optimizer
        allreduce_end.append(max(free) + allreduce_s)
        due = step - staleness
        for w, t in enumerate(workers):
            if staleness == 0:
                free[w] = allreduce_end[step]
            if due >= 0:
                free[w] = max(free[w], allreduce_end[due]) + t.decoder_optimizer
        ends.append(max(free))
    return ends


def ideal_step_time(workers: Sequence[WorkerTimes], micro_batches: int, backward_phase: bool,
                    allreduce_s: float, staleness: int = 0, threads: int = 1,
                    cores: int | None = None, n_steps: int = 24) -> float:
    """Steady-state seconds per step of the schedule (:func:`simulate`; with staleness the mean
    over the second half of ``n_steps``, once the pipeline runs across step boundaries). With
    more ``threads`` than ``cores`` every compute time is stretched by threads / cores."""
    stretch = max(1.0, threads / cores) if cores else 1.0
    scaled = [WorkerTimes(*(stretch * x for x in (t.pre_send, t.post_send, t.backward,
                                                  t.optimizer, t.decoder_optimizer)))
              for t in workers]
    if staleness == 0:
        return simulate(scaled, micro_batches, backward_phase, allreduce_s)[0]
    ends = simulate(scaled, micro_batches, backward_phase, allreduce_s, staleness, n_steps)
    half = n_steps // 2
    return (ends[-1] - ends[half - 1]) / (n_steps - half)


@dataclass(frozen=True)
class SpeedupFactors:
    """Async RGC's throughput over backprop's, as a product of four factors (each a ratio):

    * ``core_ratio``: the async executor's cores over backprop's (the paper's 29 worker threads
      against 24: 1.208);
    * ``work_efficiency``: backprop's core-seconds per step over the async stages' (their
      compute measured alone, summed over workers, times each worker's cores): how much less
      CPU time RGC's small per-stage thread groups spend on a step, readouts included;
    * ``utilisation``: the stages' compute over the async cores' time in the ideal schedule
      (:func:`ideal_step_time`): 1 minus the bubble and the imbalance between workers;
    * ``executor_efficiency``: the ideal step over the measured one (transfers, Python, memory
      contention: what :func:`ideal_step_time` leaves out).

    Their product is the measured ratio exactly (:func:`decompose`)."""

    core_ratio: float
    work_efficiency: float
    utilisation: float
    executor_efficiency: float

    @property
    def speedup(self) -> float:
        return self.core_ratio * self.work_efficiency * self.utilisation * \
            self.executor_efficiency


def decompose(backprop_step_s: float, backprop_cores: float, async_step_s: float,
              ideal_step_s: float, busy_core_s: float, async_cores: float) -> SpeedupFactors:
    """The factors of ``backprop_step_s / async_step_s`` (:class:`SpeedupFactors`).

    ``busy_core_s``: the async workers' compute per step measured alone, each times its cores
    (thread count), summed; ``ideal_step_s``: the schedule's step from those times."""
    for name, v in (("backprop_step_s", backprop_step_s), ("backprop_cores", backprop_cores),
                    ("async_step_s", async_step_s), ("ideal_step_s", ideal_step_s),
                    ("busy_core_s", busy_core_s), ("async_cores", async_cores)):
        check(v > 0, name, v, "must be > 0")
    return SpeedupFactors(core_ratio=async_cores / backprop_cores,
                          work_efficiency=backprop_step_s * backprop_cores / busy_core_s,
                          utilisation=busy_core_s / (async_cores * ideal_step_s),
                          executor_efficiency=ideal_step_s / async_step_s)
