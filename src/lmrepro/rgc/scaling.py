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

Executors. Quality runs use the one-process executors: ``sync`` RGC computes what the ``async``
executor computes (the same updates to float rounding, ~1e-7 relative, for every horizon and
staleness: tests/test_rgc_async.py), so the study's RGC figures stand for the async executor's,
and ``parallel`` runs train at once, each on ``threads`` threads, which keeps 2 cores
busy with small models (a run's clock is therefore not a throughput figure; the study reports
none).

Run directories: ``<stage>/sweep/<size>/L<steps>/<run>@lr<lr>/seed<N>/`` and
``<stage>/runs/<size>/L<steps>/<run>/seed<N>/``; each ``<run>`` directory stores its identity
(the run's whole configuration and the data's manifest, :func:`lmrepro.rundirs.prepare_runs_dir`),
so adding a run or a seed keeps every finished one and a changed setting never reuses one.
The analysis is :mod:`lmrepro.rgc.scaling_report`.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmrepro.data.stage import data_identity
from lmrepro.io import atomic_write_json, read_json
from lmrepro.model import ModelConfig
from lmrepro.results import SUMMARY, read_summary
from lmrepro.rundirs import prepare_runs_dir, restore_run, seed_dir
from lmrepro.rgc.config import RGCConfig, RGCScaling, RGCStudyRun, RGCSuite
from lmrepro.runlock import holds_writer_lock
from lmrepro.sweep import beyond_edge, edge_row, on_edge, select_best

log = logging.getLogger(__name__)

PLAN = "plan.json"
SWEEP_JSON = "sweep.json"


def run_config(base: RGCConfig, shape: ModelConfig, run: RGCStudyRun, steps: int,
               warmup_fraction: float, threads: int) -> RGCConfig:
    """The configuration of one study run: ``base`` with the model ``shape`` (the size's whole
    model), ``steps`` steps (lr warm-up a fraction of them, a checkpoint every quarter), the run's
    lr, horizon (when it sets one) and staleness, ``threads`` threads for the one-process
    executors."""
    return RGCConfig(**{**base.to_dict(), "model": shape.to_dict(), "steps": steps,
                        "warmup_steps": round(warmup_fraction * steps),
                        "checkpoint_every": max(1, steps // 4), "eval_every": 0,
                        "lr": run.lr, "consensus_staleness": run.consensus_staleness,
                        "horizon": run.horizon or base.horizon,
                        "backprop_threads": threads})


def sweep_lr(lr: float, factor: float) -> float:
    """A sweep value: ``lr * factor`` to 3 significant digits (the name of its directory)."""
    return float(f"{lr * factor:.3g}")


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
    from lmrepro.rgc.runner import train

    if not (job.run_dir / SUMMARY).exists():
        cfg = RGCConfig(**job.config)
        train(cfg, job.executor, np.asarray(load_split(job.corpus_dir, "train")),
              np.asarray(load_split(job.corpus_dir, "val")), job.run_dir, job.corpus, job.name,
              seed=job.seed, test_data=np.asarray(load_split(job.corpus_dir, "test")))
    return job.run_dir


class Study:
    """Runs the study under ``stage_dir`` (see the module docstring)."""

    def __init__(self, study: RGCScaling, base: RGCConfig, corpus: str,
                 prepared_dir: str | Path, stage_dir: str | Path,
                 restore_from: str | Path | None = None) -> None:
        self.study, self.base, self.corpus = study, base, corpus
        self.corpus_dir = Path(prepared_dir) / corpus
        self.data = data_identity(prepared_dir, corpus)
        self.stage = Path(stage_dir)
        # a published study's stage folder: its runs are put back instead of trained
        self.restore_from = None if restore_from is None else Path(restore_from)

    def jobs(self, kind: str, size: str, steps: int, runs: list[RGCStudyRun],
             seeds: list[int]) -> list[Job]:
        """The jobs of one point; each run's directory checked against its identity first."""
        s = self.study
        out = []
        for run in runs:
            cfg = run_config(self.base, s.sizes[size], run, steps, s.warmup_fraction,
                             s.threads)
            root = prepare_runs_dir(self.stage / kind / size / f"L{steps}" / run.name, {
                "config": cfg.to_dict(), "executor": run.executor, "corpus": self.corpus,
                "data": self.data})
            out += [Job(root / seed_dir(seed), cfg.to_dict(), run.executor, seed,
                        self.corpus_dir, self.corpus, run.name) for seed in seeds]
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

    def sweep(self) -> dict[str, float]:
        """The verdict point's lr sweep (one seed, validation split); the winners by run."""
        s = self.study
        if not s.sweep_factors:
            return {}
        grid = [(run, run.model_copy(update={"name": f"{run.name}@lr{sweep_lr(run.lr, f):g}",
                                             "lr": sweep_lr(run.lr, f)}))
                for run in s.runs for f in s.sweep_factors]
        jobs = self.jobs("sweep", s.verdict_size, s.verdict_steps, [g for _, g in grid],
                         [s.sweep_seed])
        rows = []
        for (run, at), d in zip(grid, self.execute(jobs)):
            summary = read_summary(d)
            rows.append({"run": run.name, "lr": at.lr, "final_bpb": summary.final_bpb,
                         "diverged_at_step": summary.diverged_at_step})
        best = select_best(rows)
        atomic_write_json(self.stage / "sweep" / SWEEP_JSON, {
            "size": s.verdict_size, "steps": s.verdict_steps, "seed": s.sweep_seed,
            "factors": s.sweep_factors, "rows": rows, "best": best,
            "on_edge": on_edge(rows, best)})
        return best

    def edge_check(self) -> dict[str, Any] | None:
        """After everything else: each sweep winner on the grid's edge trained once more one
        grid step beyond it (the sweep's seed and length), to say whether the tuned lr is the
        optimum or the grid cut it off. Reported (``sweep/edge_check.json``), not applied."""
        path = self.stage / "sweep" / SWEEP_JSON
        if not path.exists():
            return None
        table = read_json(path)
        s = self.study
        by_name = {r.name: r for r in s.runs}
        beyond: list[tuple[str, RGCStudyRun]] = []
        for name in table["on_edge"]:
            lr = beyond_edge(table["rows"], table["best"], name)
            beyond.append((name, by_name[name].model_copy(
                update={"name": f"{name}@lr{lr:g}", "lr": lr})))
        rows = []
        if beyond:
            jobs = self.jobs("sweep-edge", s.verdict_size, s.verdict_steps,
                             [b for _, b in beyond], [s.sweep_seed])
            for (name, at), d in zip(beyond, self.execute(jobs)):
                got = read_summary(d)
                rows.append(edge_row(table["rows"], table["best"], name, at.lr, got.final_bpb,
                                     got.diverged_at_step))
        out = {"size": table["size"], "steps": table["steps"], "seed": table["seed"],
               "rows": rows}
        atomic_write_json(self.stage / "sweep" / "edge_check.json", out)
        return out

    def runs_of(self, size: str, best: dict[str, float]) -> list[RGCStudyRun]:
        if size != self.study.verdict_size:
            return list(self.study.runs)
        return [r.model_copy(update={"lr": best[r.name]}) if r.name in best else r
                for r in self.study.runs]

    def run(self) -> dict[str, Path]:
        """The sweep, then every point, the verdict point first (so an interrupted study has
        the verdict first)."""
        s = self.study
        best = self.sweep()
        vsize, vsteps = s.verdict_size, s.verdict_steps
        points = [(vsize, vsteps, sorted(set(s.seeds[vsize]) | set(s.verdict_seeds)))]
        points += [(size, steps, s.seeds[size]) for size, lengths in s.lengths.items()
                   for steps in lengths if (size, steps) != (vsize, vsteps)]
        jobs = [j for size, steps, seeds in points
                for j in self.jobs("runs", size, steps, self.runs_of(size, best), seeds)]
        dirs = self.execute(jobs)
        out = {str(d.relative_to(self.stage / "runs")): d for d in dirs}
        if s.edge_check:
            self.edge_check()
        atomic_write_json(self.stage / PLAN, {"runs": {k: str(v) for k, v in out.items()},
                                              "lrs": best, "parallel": s.parallel,
                                              "threads": s.threads})
        return out


@holds_writer_lock("stage_dir")
def run_study(suite: RGCSuite, prepared_dir: str | Path,
              stage_dir: str | Path = "results/rgc_scaling",
              restore_from: str | Path | None = None) -> dict[str, Path]:
    """Run or resume ``suite.scaling`` on the section's first corpus; returns every finished
    run directory by its path below ``runs/``. With ``restore_from`` (a published study's stage
    folder) the runs not finished here are put back from it, none trained: sound where the
    current code trains them bit-identically on this CPU model (docs/rgc.md)."""
    assert suite.scaling is not None
    Path(stage_dir).mkdir(parents=True, exist_ok=True)
    return Study(suite.scaling, suite.config, suite.corpora[0], prepared_dir, stage_dir,
                 restore_from).run()


def scaling_stage(suite: RGCSuite, prepared_dir: str | Path,
                  stage_dir: str | Path = "results/rgc_scaling") -> dict[str, Path]:
    """The ``train_rgc_scaling`` stage: the study of ``suite.scaling`` (run or resumed), or, in
    a profile without one, a plan saying so (the stage's outputs always exist)."""
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    if suite.scaling is None:
        atomic_write_json(stage_dir / PLAN, {"runs": {}, "lrs": {},
                                             "note": "no training-length study in this profile"})
        return {}
    return run_study(suite, prepared_dir, stage_dir)
