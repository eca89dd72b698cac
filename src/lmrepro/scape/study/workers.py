"""The worker-count study of SCAPE (``scape.workers`` in ``params.yaml``; the ``workers*``
profiles): what changes for SCAPE and top-k from 2 to 16 data-parallel workers at a fixed global
batch and number of tokens?

With W workers each sees ``1/W`` of the batch. Top-k's masks are the workers' own, so the union
of coordinates that move and the bytes each worker gathers grow with W; SCAPE sends one mask per
tensor, the same from every worker, chosen by the tensor's owner from its own corrected momentum
(a view of ``1/W`` of the batch, noisier as W grows). The study trains every run of ``runs`` at
every W of ``workers`` with the same data, seeds, steps, clipping and schedules, W simulated in
one process (:mod:`lmrepro.scape.train.simulated`: the optimizers' own code, the numbers of the
``torchrun`` path).

Order (one call resumes where an interrupted one stopped; a finished run is never retrained):

1. at each W of ``sweep_workers``, every run at ``sweep_factors`` times its centre lr on the
   held-out ``sweep_seed``, scored on the validation split; a winner on the edge of what was
   tried is trained one grid step beyond it (at most ``max_extensions`` times) until it is
   interior, before any verdict run;
2. every run at every W and verdict seed, at the winner of the nearest swept W (log W).

Run directories: ``<stage>/sweep/W<w>/seed<s>/<run>@lr<lr>/`` and
``<stage>/runs/W<w>/seed<s>/<run>/``; each holds ``job.json`` (what it was trained with): a
finished run whose job differs from the one asked for is an error, never silently reused.
``<stage>/sweep/sweep.json`` lists every sweep run, its validation and test loss and the
winners. The analysis is :mod:`lmrepro.scape.study.workers_report`.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmrepro.errors import ParameterError
from lmrepro.io import atomic_write_json, read_json
from lmrepro.model import ModelConfig
from lmrepro.results import SUMMARY
from lmrepro.rundirs import run_path
from lmrepro.scape.config import ScapeConfig, ScapeRun, ScapeSuite, WorkersStudy

log = logging.getLogger(__name__)

JOB = "job.json"
SWEEP = "sweep.json"


@dataclass(frozen=True)
class Job:
    """One run of the study: everything its process needs (plain data, picklable)."""

    settings: dict[str, Any]
    run: dict[str, Any]
    model: dict[str, Any]
    corpus_dir: str
    corpus: str
    out: str
    seed: int
    workers: int
    probe_every: int


def settings_at(base: ScapeConfig, study: WorkersStudy, workers: int) -> ScapeConfig:
    """The shared settings at ``workers`` workers: the study's steps and warm-ups (fractions
    of the run), each worker ``global_batch / workers`` sequences, no curve."""
    steps = study.steps
    return base.replace(steps=steps, batch_size=study.global_batch // workers,
                        warmup_steps=round(study.warmup_fraction * steps),
                        sparsity_warmup_steps=round(study.sparsity_warmup_fraction * steps),
                        checkpoint_every=max(base.checkpoint_every, steps // 4), eval_at=[])


def nearest_swept(workers: int, swept: list[int]) -> int:
    """The swept worker count nearest ``workers`` in log W (the smaller on a tie)."""
    return min(sorted(swept), key=lambda s: abs(math.log2(s) - math.log2(workers)))


def lr_tag(lr: float) -> str:
    return f"{lr:.6g}"


def train_job(job: Job) -> str:
    """Train (or resume, or reuse) one run; its own process. Returns the run directory."""
    from lmrepro.scape.train.simulated import train_simulated
    from lmrepro.scape.train.trainer import RunTarget

    out = Path(job.out)
    wanted = asdict(job)
    if (out / SUMMARY).exists():
        had = read_json(out / JOB) if (out / JOB).exists() else None
        # where the run lies is not what it is: a study moved as a whole is reused
        if had is None or {**had, "out": ""} != {**wanted, "out": ""}:
            raise ParameterError("run directory", str(out), "holds a finished run of other "
                                 f"settings ({out / JOB}); move it away to retrain")
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / JOB, wanted)
    train_simulated(ScapeConfig(**job.settings), ScapeRun(**job.run), ModelConfig(**job.model),
                    RunTarget(job.corpus_dir, str(out), job.seed, job.corpus), job.workers,
                    job.probe_every)
    return str(out)


class WorkersStudyRunner:
    """The study's jobs and their order (see the module docstring)."""

    def __init__(self, suite: ScapeSuite, prepared_dir: str | Path, stage_dir: str | Path) -> None:
        assert suite.workers is not None
        self.study, self.base, self.corpus = suite.workers, suite.settings, suite.corpus
        self.corpus_dir = str(Path(prepared_dir) / suite.corpus)
        self.stage = Path(stage_dir)

    def job(self, run: ScapeRun, workers: int, seed: int, out: Path) -> Job:
        return Job(settings_at(self.base, self.study, workers).to_dict(), run.to_dict(),
                   self.study.model.to_dict(), self.corpus_dir, self.corpus, str(out), seed,
                   workers, self.study.probe_every)

    def sweep_dir(self, workers: int, run: ScapeRun, lr: float) -> Path:
        return (self.stage / "sweep" / f"W{workers}" / f"seed{self.study.sweep_seed}"
                / f"{run.run_name}@lr{lr_tag(lr)}")

    def verdict_dir(self, workers: int, seed: int, run: ScapeRun) -> Path:
        return self.stage / "runs" / run_path(f"W{workers}", seed, run.run_name)

    def execute(self, jobs: list[Job]) -> None:
        todo = [j for j in jobs if not (Path(j.out) / SUMMARY).exists()]
        for j in jobs:
            if j not in todo:
                train_job(j)             # checks a finished run's job
        if not todo:
            return
        log.info("workers study: %d runs to train, %d at once", len(todo), self.study.parallel)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(self.study.parallel, mp_context=ctx) as pool:
            for done in pool.map(train_job, todo):
                log.info("finished %s", done)

    def sweep(self) -> dict[str, Any]:
        """Bracket every run's lr at each swept W, extending edge winners; returns the record."""
        study = self.study
        tried: dict[tuple[int, str], list[float]] = {
            (w, r.run_name): [r.lr_or(self.base.lr) * f for f in study.sweep_factors]
            for w in study.sweep_workers for r in study.runs}
        ratio = study.sweep_factors[1] / study.sweep_factors[0]
        by_name = {r.run_name: r for r in study.runs}
        for _ in range(study.max_extensions + 1):
            self.execute([self.job(by_name[n].replace(lr=lr), w,
                                   study.sweep_seed, self.sweep_dir(w, by_name[n], lr))
                          for (w, n), lrs in tried.items() for lr in lrs])
            grew = False
            most = len(study.sweep_factors) + study.max_extensions
            for (w, n), lrs in tried.items():
                best = self.winner(w, by_name[n], lrs)
                if best == min(lrs) and len(lrs) < most:
                    lrs.insert(0, min(lrs) / ratio)
                    grew = True
                elif best == max(lrs) and len(lrs) < most:
                    lrs.append(max(lrs) * ratio)
                    grew = True
            if not grew:
                break
        record = self.sweep_record(tried, by_name)
        atomic_write_json(self.stage / "sweep" / SWEEP, record)
        return record

    def scores(self, w: int, run: ScapeRun, lr: float) -> tuple[float, float]:
        s = read_json(self.sweep_dir(w, run, lr) / SUMMARY)
        val = s.get("final_bpb")
        test = (s.get("details") or {}).get("final_test_bpb")
        return (math.inf if val is None else float(val), math.inf if test is None else float(test))

    def winner(self, w: int, run: ScapeRun, lrs: list[float]) -> float:
        return min(lrs, key=lambda lr: self.scores(w, run, lr)[0])

    def sweep_record(self, tried: dict[tuple[int, str], list[float]],
                     by_name: dict[str, ScapeRun]) -> dict[str, Any]:
        rows, winners = [], {}
        for (w, n), lrs in sorted(tried.items()):
            run = by_name[n]
            best = self.winner(w, run, lrs)
            best_test = min(lrs, key=lambda lr: self.scores(w, run, lr)[1])
            winners[f"W{w}/{n}"] = {"lr": best, "interior": min(lrs) < best < max(lrs),
                                    "test_winner": best_test,
                                    "agree": math.isclose(best, best_test)}
            for lr in sorted(lrs):
                val, test = self.scores(w, run, lr)
                rows.append({"workers": w, "run": n, "lr": lr,
                             "val_bpb": None if math.isinf(val) else val,
                             "test_bpb": None if math.isinf(test) else test,
                             "winner": math.isclose(lr, best)})
        return {"seed": self.study.sweep_seed, "rows": rows, "winners": winners}

    def run(self) -> list[Path]:
        """The sweep, then every verdict run; returns the verdict run directories."""
        self.stage.mkdir(parents=True, exist_ok=True)
        record = self.sweep()
        jobs, dirs = [], []
        for w in self.study.workers:
            ref = nearest_swept(w, self.study.sweep_workers)
            for seed in self.study.seeds:
                for r in self.study.runs:
                    lr = record["winners"][f"W{ref}/{r.run_name}"]["lr"]
                    out = self.verdict_dir(w, seed, r)
                    jobs.append(self.job(r.replace(lr=lr), w, seed, out))
                    dirs.append(out)
        self.execute(jobs)
        return dirs


def run_workers_study(suite: ScapeSuite, prepared_dir: str | Path,
                      stage_dir: str | Path = "results/workers") -> list[Path]:
    """Run or resume ``suite.workers``; returns the verdict run directories."""
    return WorkersStudyRunner(suite, prepared_dir, stage_dir).run()

