"""The training-length study of RGC (``rgc.scaling`` in ``params.yaml``): RGC against global
backprop where the models learn, with the seed as the unit.

The paper's quality claim (RGC not non-inferior to backprop on enwik8 with a 24-layer model) is
about models far past an n-gram table; a verdict at a few hundred steps is taken before. The
study trains every run of ``runs`` (lockstep RGC, RGC with its decoder consensus applied
``consensus_staleness`` steps late, each at the section's horizon or its own, global backprop;
each an :class:`RGCStudyRun`) on the RGC harness at several training lengths of each model
size (the ``rgc_horizon`` profiles: one length, RGC at every horizon and staleness):

* every length of every size with the study's ``seeds``; the verdict point (``verdict_size`` at
  its longest length) with ``verdict_seeds`` (>= 5: the seed is the unit of the test);
* the lr warm-up scales with the run (``warmup_fraction``), so every length sees the same shape;
* first, an lr sweep at the verdict point (``sweep_factors`` times each run's lr, one seed the
  study does not use, scored on the validation split); its winners are every length's lr at the
  verdict size, and the verdict is judged on the test split.

The order, the sweep and its edge check are the shared engine's
(:mod:`lmrepro.pipeline.study_engine`); :class:`RGCStudy` supplies RGC's runs, their
directories and identities, and trains them as independent jobs in a process pool (or puts a
published study's runs back).

Executors. Quality runs use the one-process executors: ``sync`` RGC computes what the ``async``
executor computes (the same updates to float rounding, ~1e-7 relative, for every horizon and
staleness: tests/test_rgc_async.py), so the study's RGC figures stand for the async executor's,
and ``parallel`` runs train at once, each on ``threads`` threads, which keeps 2 cores
busy with small models (a run's clock is therefore not a throughput figure; the study reports
none).

Run directories: ``<stage>/sweep/<size>/L<steps>/seed<N>/<run>@lr<lr>/`` and
``<stage>/runs/<size>/L<steps>/seed<N>/<run>/`` (the one layout, :func:`lmrepro.rundirs.run_path`;
run-first folders, ``<run>/seed<N>``, are moved there first: :func:`lmrepro.rundirs.seed_first`);
each run's directory stores its own identity (the run's whole configuration and the data's
manifest, :func:`lmrepro.rundirs.prepare_runs_dir`), so adding a run or a seed keeps every
finished one and a changed setting never reuses one.
The analysis is :mod:`lmrepro.rgc.study.report`.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmrepro.data.stage import data_identity
from lmrepro.model import ModelConfig
from lmrepro.pipeline.study_engine import LengthStudy, Point, RunDirs, no_study
from lmrepro.results import SUMMARY
from lmrepro.rundirs import prepare_runs_dir, restore_run, run_path, seed_first
from lmrepro.rgc.config import RGCConfig, RGCScaling, RGCStudyRun, RGCSuite
from lmrepro.runlock import holds_writer_lock

log = logging.getLogger(__name__)


def run_config(base: RGCConfig, shape: ModelConfig, run: RGCStudyRun, steps: int,
               warmup_fraction: float, threads: int) -> RGCConfig:
    """The configuration of one study run: ``base`` with the model ``shape`` (the size's whole
    model), ``steps`` steps (lr warm-up a fraction of them, a checkpoint every quarter), the run's
    lr, horizon and local-loss weight (when it sets them) and staleness, ``threads`` threads for
    the one-process executors."""
    return RGCConfig(**{**base.to_dict(), "model": shape.to_dict(), "steps": steps,
                        "warmup_steps": round(warmup_fraction * steps),
                        "checkpoint_every": max(1, steps // 4), "eval_every": 0,
                        "lr": run.lr, "consensus_staleness": run.consensus_staleness,
                        "horizon": run.horizon or base.horizon,
                        "local_loss_weight": run.loss_weight_in(base),
                        "backprop_threads": threads})


@dataclass(frozen=True)
class Job:
    """One run to train: where, how, on which data."""

    run_dir: Path
    config: dict[str, Any]
    executor: str
    seed: int
    corpus_dir: Path
    corpus: str
    name: str


def train_job(job: Job) -> Path:
    """Train one study run (in a pool worker): a finished run is left as it is, an interrupted
    one resumes from its checkpoint."""
    import numpy as np

    from lmrepro.data.prepare import load_split
    from lmrepro.rgc.executors.runner import train

    if not (job.run_dir / SUMMARY).exists():
        cfg = RGCConfig(**job.config)
        train(cfg, job.executor, np.asarray(load_split(job.corpus_dir, "train")),
              np.asarray(load_split(job.corpus_dir, "val")), job.run_dir, job.corpus, job.name,
              seed=job.seed, test_data=np.asarray(load_split(job.corpus_dir, "test")))
    return job.run_dir


class RGCStudy:
    """What RGC supplies to the study engine (:class:`lmrepro.pipeline.study_engine.StudyWing`):
    its runs, each a job of its own, trained ``parallel`` at a time or put back from a
    published study."""

    def __init__(self, study: RGCScaling, base: RGCConfig, corpus: str,
                 prepared_dir: str | Path, stage_dir: str | Path,
                 restore_from: str | Path | None = None) -> None:
        self.study, self.base, self.corpus = study, base, corpus
        self.corpus_dir = Path(prepared_dir) / corpus
        self.data = data_identity(prepared_dir, corpus)
        self.stage = Path(stage_dir)
        # a published study's stage folder: its runs are put back instead of trained
        self.restore_from = None if restore_from is None else Path(restore_from)

    def runs(self, size: str) -> list[RGCStudyRun]:
        return list(self.study.runs)

    def name(self, run: RGCStudyRun) -> str:
        return run.name

    def lr(self, run: RGCStudyRun) -> float:
        return run.lr

    def at_lr(self, run: RGCStudyRun, lr: float) -> RGCStudyRun:
        return run.model_copy(update={"lr": lr})

    def variant(self, run: RGCStudyRun, lr: float) -> RGCStudyRun:
        return run.model_copy(update={"name": f"{run.name}@lr{lr:g}", "lr": lr})

    def train(self, points: Sequence[Point[RGCStudyRun]]) -> list[RunDirs]:
        """Every point's jobs in one pool (:meth:`execute`), so points overlap."""
        jobs = [self.jobs(p.kind, p.size, p.steps, p.runs, p.seeds) for p in points]
        done = iter(self.execute([j for js in jobs for j in js]))
        return [{(j.name, j.seed): next(done) for j in js} for js in jobs]

    def extras(self, verdict_runs: list[RGCStudyRun]) -> dict[str, Path]:
        return {}

    def jobs(self, kind: str, size: str, steps: int, runs: list[RGCStudyRun],
             seeds: list[int]) -> list[Job]:
        """The jobs of one point; each run's directory checked against its identity first."""
        s = self.study
        point = self.stage / kind / size / f"L{steps}"
        seed_first(point)
        out = []
        for run in runs:
            cfg = run_config(self.base, s.sizes[size], run, steps, s.warmup_fraction,
                             s.threads)
            identity = {"config": cfg.to_dict(), "executor": run.executor,
                        "corpus": self.corpus, "data": self.data}
            out += [Job(prepare_runs_dir(run_path(point, seed, run.name), identity),
                        cfg.to_dict(), run.executor, seed, self.corpus_dir, self.corpus,
                        run.name) for seed in seeds]
        return out

    def execute(self, jobs: list[Job]) -> list[Path]:
        """Train ``jobs``, ``parallel`` at a time (in their order); the finished directories."""
        todo = [j for j in jobs if not (j.run_dir / SUMMARY).exists()]
        if self.restore_from is not None:
            for j in todo:
                restore_run(j.run_dir, self.stage, self.restore_from)
            log.info("RGC study: %d of %d runs put back from %s", len(todo), len(jobs),
                     self.restore_from)
            return [j.run_dir for j in jobs]
        log.info("RGC study: %d of %d runs to train, %d at a time", len(todo), len(jobs),
                 self.study.parallel)
        if todo and self.study.parallel > 1:
            ctx = multiprocessing.get_context("spawn")   # no forked torch state in the workers
            with ProcessPoolExecutor(self.study.parallel, mp_context=ctx) as pool:
                list(pool.map(train_job, todo))
        else:
            for j in todo:
                train_job(j)
        return [j.run_dir for j in jobs]


@holds_writer_lock("stage_dir")
def run_study(suite: RGCSuite, prepared_dir: str | Path,
              stage_dir: str | Path = "results/rgc_scaling",
              restore_from: str | Path | None = None) -> dict[str, Path]:
    """Run or resume ``suite.scaling`` on the section's first corpus; returns every finished
    run directory by its path below ``runs/``. With ``restore_from`` (a published study's stage
    folder) the runs not finished here are put back from it, none trained: sound where the
    current code trains them bit-identically on this CPU model (docs/rgc.md)."""
    s = suite.scaling
    assert s is not None
    Path(stage_dir).mkdir(parents=True, exist_ok=True)
    wing = RGCStudy(s, suite.config, suite.corpora[0], prepared_dir, stage_dir, restore_from)
    # the sweep's order and the plan's notes as the published studies have them
    return LengthStudy(s, wing, stage_dir, sweep_order="by_run",
                       plan_notes={"parallel": s.parallel, "threads": s.threads}).run()


def scaling_stage(suite: RGCSuite, prepared_dir: str | Path,
                  stage_dir: str | Path = "results/rgc_scaling") -> dict[str, Path]:
    """The ``train_rgc_scaling`` stage: the study of ``suite.scaling`` (run or resumed), or, in
    a profile without one, a plan saying so (the stage's outputs always exist)."""
    if suite.scaling is None:
        return no_study(stage_dir)
    return run_study(suite, prepared_dir, stage_dir)
