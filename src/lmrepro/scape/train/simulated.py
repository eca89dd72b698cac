"""A SCAPE-suite run with ``workers`` data-parallel workers simulated in one process.

The worker-count study (``scape.workers``) asks what changes from 2 to 16 workers at a fixed
global batch. Sixteen ``torchrun`` processes on two cores spend most of a step waiting on each
other (measured: 146 ms a step at 16 gloo workers against 21 ms at 2, 2x64 model), so the study
runs the workers as threads of one process instead: each thread holds its own model replica,
optimizer (the package's SCAPE, TopKEF or DenseDP, unchanged) and batch stream (the same per-rank
stream as under ``torchrun``: :func:`lmrepro.seeds.batches_of_rank`), and the optimizers'
collectives meet in an :class:`lmrepro.optim.local_group.LocalGroup`. The numbers are those of
the ``torchrun`` path: equal bit for bit at two workers, to fp32 rounding beyond (the group sums
in rank order; tests/test_simulated_workers.py). No timing of such a run is a result.

What only one process sees is logged per step besides the usual records (every worker's view at
once, which no single ``torchrun`` worker has):

* top-k: ``union_sent``, the coordinates of the top-k tensors that any worker sent (the union of
  the workers' masks), and ``pair_overlap``, the mean over pairs of workers of the fraction of
  one worker's selection the other also selected;
* SCAPE, every ``probe_every`` steps: ``mask_agreement``, the fraction of the next mask chosen
  from the workers' averaged corrected momentum (each owner choosing from every worker's view)
  that the owners' own choices (each from its local view) also hold.

The run directory, checkpoints (one file: every worker's optimizer and batch stream), resume,
evaluation and summary are the ``torchrun`` trainer's (:mod:`lmrepro.scape.train.trainer`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from lmrepro.data.batches import sample_batch
from lmrepro.distributed import DistContext
from lmrepro.errors import ParameterError
from lmrepro.harness import Cadence, Diverged, Place, Run, Schedule, StepFn
from lmrepro.memory import MemorySampler
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.optim import SCAPE, NonFiniteGradientError, TopKEF
from lmrepro.optim.local_group import LocalGroup
from lmrepro.results import SUMMARY
from lmrepro.scape.config import ScapeConfig, ScapeRun
from lmrepro.scape.train.trainer import (RunTarget, _curve_point, _finish, build_optimizer,
                                         check_prepared, load_split_data, run_identity,
                                         step_record)
from lmrepro.seeds import batches_of_rank, seed_init

#: what a simulated run's identity adds to a torchrun run's (so neither resumes the other)
ENGINE = "simulated workers (threads of one process)"


def in_parallel(pool: ThreadPoolExecutor, group: LocalGroup, world: int,
                fn: Callable[[int], Any]) -> list[Any]:
    """``fn(rank)`` for every rank at once (they meet in ``group``'s collectives); the results
    in rank order. A failure aborts the group and is raised (a worker's own error before the
    others' broken waits)."""
    futures = [pool.submit(fn, r) for r in range(world)]
    out: list[Any] = []
    errors: list[BaseException] = []
    for f in futures:
        try:
            out.append(f.result())
        except BaseException as exc:       # noqa: BLE001 - re-raised below
            group.abort()
            errors.append(exc)
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                   errors[0])
    return out


def pair_overlap(selections: Sequence[torch.Tensor], n: int) -> float:
    """Mean over pairs of workers of ``|S_i & S_j| / k`` (the selections' common size ``k``):
    1 when every worker selects the same coordinates, 0 when no two share one."""
    world = len(selections)
    k = selections[0].numel()
    if world < 2 or k == 0:
        return 1.0
    counts = torch.bincount(torch.cat(list(selections)), minlength=n).to(torch.float64)
    shared = float((counts * (counts - 1) / 2).sum())
    return shared / (world * (world - 1) / 2 * k)


def topk_probe(opts: Sequence[TopKEF]) -> dict[str, float]:
    """Top-k's union of the workers' masks and their pairwise overlap (this step)."""
    first = opts[0]
    union = int(first._sent.sum()) - first.n_excluded
    return {"union_sent": union,
            "pair_overlap": pair_overlap([o.last_selected for o in opts], first.n)}


def scape_probe(opts: Sequence[SCAPE]) -> dict[str, float]:
    """SCAPE's next mask as the owners chose it (each from its own corrected momentum) against
    the mask they would choose from the workers' averaged one: the fraction of the latter the
    former holds (both have the same size per tensor)."""
    first = opts[0]
    density = first._density_of_step(first.num_steps)
    if density >= 1.0 or any(o._pending is None or o.last_corrected is None for o in opts):
        return {}
    mean_c = torch.stack([o.last_corrected for o in opts]).sum(0).div_(len(opts))  # type: ignore[misc]
    chosen = torch.cat([o._pending.own for o in opts])  # type: ignore[union-attr]
    ideal = torch.cat([o._select_owned(mean_c, density) for o in opts])
    hit = torch.zeros(first.n, dtype=torch.bool)
    hit[chosen] = True
    return {"mask_agreement": float(hit[ideal].sum()) / max(ideal.numel(), 1)}


def _probe(opts: list[Any], step: int, probe_every: int) -> dict[str, float]:
    if isinstance(opts[0], TopKEF) and opts[0].last_step_info.get("sparsity", 0.0) > 0.0:
        return topk_probe(opts)
    if isinstance(opts[0], SCAPE) and probe_every and step % probe_every == 0:
        return scape_probe(opts)
    return {}


class SimulatedWorkers:
    """The ``world`` workers of one run: replicas, optimizers, batch streams, threads."""

    def __init__(self, cfg: ScapeConfig, run: ScapeRun, mcfg: ModelConfig, seed: int,
                 world: int) -> None:
        self.world = world
        self.group = LocalGroup(world, timeout_s=cfg.timeout_s)
        self.pool = ThreadPoolExecutor(max_workers=world, thread_name_prefix="worker")
        self.models: list[ByteTransformer] = []
        for _ in range(world):
            seed_init(seed)
            self.models.append(ByteTransformer(mcfg))
        members = self.group.members()
        self.opts = self.run(lambda r: build_optimizer(cfg, run, self.models[r],
                                                       process_group=members[r]))
        self.gens = [batches_of_rank(seed, r) for r in range(world)]

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        return in_parallel(self.pool, self.group, self.world, fn)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def state(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.opts],
                "generators": [g.get_state() for g in self.gens],
                "model": self.models[0].state_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for m in self.models:
                m.load_state_dict(state["model"])
        for o, s in zip(self.opts, state["optimizers"]):
            o.load_state_dict(s)
        for g, s in zip(self.gens, state["generators"]):
            g.set_state(s)


def _step_fn(cfg: ScapeConfig, mcfg: ModelConfig, w: SimulatedWorkers, train_data: Any,
             probe_every: int) -> StepFn:
    """Every worker's step at once (batch, forward, backward, the optimizer's collective step);
    the loss averaged over workers in rank order, as the torchrun trainer's all-reduce."""

    def work(i: int, lr: float) -> Callable[[int], float]:
        def one(r: int) -> float:
            opt, model = w.opts[r], w.models[r]
            for g in opt.param_groups:
                g["lr"] = lr
            x, y = sample_batch(train_data, cfg.batch_size, mcfg.context, w.gens[r])
            loss = lm_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return float(loss.detach().to(torch.float64))
        return one

    def step(i: int, lr: float) -> dict[str, Any]:
        probing = bool(probe_every) and i % probe_every == 0
        for o in w.opts:
            if isinstance(o, SCAPE):
                o.keep_corrected = probing
        try:
            losses = w.run(work(i, lr))
        except NonFiniteGradientError as err:     # raised by every worker: nothing updated
            raise Diverged(str(err)) from None
        mean_loss = 0.0
        for v in losses:                          # rank order, as the all-reduce of torchrun
            mean_loss += v
        mean_loss /= w.world
        if not math.isfinite(mean_loss):
            raise Diverged(f"mean loss {mean_loss}")
        return {"loss": mean_loss, **step_record(w.opts[0]), **_probe(w.opts, i, probe_every)}

    return step


def train_simulated(cfg: ScapeConfig, run: ScapeRun, mcfg: ModelConfig, target: RunTarget,
                    workers: int, probe_every: int = 10) -> Path:
    """Run (or resume, or skip if finished) one run with ``workers`` simulated workers."""
    check_prepared(target.corpus_dir)
    if cfg.precision != "fp32" or cfg.compile:
        raise ParameterError("precision / compile", f"{cfg.precision} / {cfg.compile}",
                             "simulated workers compute in eager fp32 only (a CPU study "
                             "engine); use the torchrun trainer for bf16 or compile")
    torch.set_num_threads(cfg.threads)
    out = Path(target.out)
    ctx = DistContext(rank=0, world_size=workers, local_rank=0, device=torch.device("cpu"),
                      backend="local-threads", timeout_s=cfg.timeout_s)
    identity = {**run_identity(cfg, run, mcfg, target, workers), "engine": ENGINE}
    with Run(out, identity, Schedule.of(cfg, run.lr_or(cfg.lr)),
             Cadence(cfg.steps, cfg.checkpoint_every, eval_at=frozenset(cfg.eval_at),
                     keep_at=frozenset(cfg.keep_checkpoints_at)),
             cfg.batch_size * mcfg.context * workers,
             sampler=MemorySampler(children=False), place=Place(0, 1, None)) as harness:
        if harness.finished():
            print(f"{out / SUMMARY} exists: run already finished, nothing to do", flush=True)
            return out
        train_data = load_split_data(target.corpus_dir, "train")
        w = SimulatedWorkers(cfg, run, mcfg, target.seed, workers)
        try:
            start = harness.resume(w.restore)
            if start:
                print(f"resuming {out} at step {start}", flush=True)
            for m in w.models:
                m.train()
            diverged = harness.train(_step_fn(cfg, mcfg, w, train_data, probe_every), w.state,
                                     _curve_point(cfg, mcfg, target, ctx, w.models[0]))
        finally:
            w.close()
        if diverged is not None:
            print(f"{run.run_name}: diverged at step {diverged}: "
                  f"{harness.records[-1]['diverged']}", flush=True)
        _finish(cfg, run, mcfg, target, ctx, harness, w.models[0], [harness.peak()], diverged)
    return out

