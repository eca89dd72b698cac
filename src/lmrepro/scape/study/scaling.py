"""The training-length study of SCAPE (``scape.scaling`` in ``params.yaml``; the ``scaling``
profile): does SCAPE's gap to dense AdamS/AdamW close or grow where the models learn?

The papers' quality claims are about 100 000-iteration runs of 345M-500M-parameter models; a
verdict at a few hundred steps of a sub-million-parameter model is taken before the models beat
an n-gram table. The study trains every method of ``runs`` (the suite's harness: same data,
seeds, clipping, weight-decay groups, schedules) at several training lengths and model sizes:

* every length of every size with the study's ``seeds``; the verdict point (``verdict_size`` at
  its longest length) with ``verdict_seeds`` (>= 5: the seed is the unit of the test);
* the lr warm-up and the sparse methods' sparsity warm-up scale with the run, as fractions of it
  (the SCAPE authors' scripts: 2-5 % and 8-10 % of the run), so every length sees the same shape;
* before anything else, a learning-rate sweep at the verdict point (``sweep_factors`` times each
  run's own lr, one seed the study does not use, scored on the validation split); its winners
  are every length's lr at the verdict size (the verdict is then judged on the test split). Other
  sizes keep their runs' lrs (say where they came from in the profile);
* named ablations at the verdict point (``ablations``: weight decay off or only on the
  coordinates updated, a longer sparsity warm-up, ...) with ``ablation_seeds``; each varies one
  run of ``runs``, never the default.

The order, the sweep and its edge check are the shared engine's
(:mod:`lmrepro.pipeline.study_engine`); :class:`ScapeStudy` supplies SCAPE's runs, their
settings and directories, each point trained as one distributed suite per seed, and the
ablations.

Run directories: ``<stage>/sweep/<size>/L<steps>/seed<N>/<run>@lr<lr>/``,
``<stage>/runs/<size>/L<steps>/seed<N>/<run>/`` and
``<stage>/ablations/<ablation>/<size>/L<steps>/seed<N>/<ablation>/``; each point directory
stores its identity (:func:`lmrepro.rundirs.prepare_runs_dir`), so a changed setting never
reuses a run and an interrupted study resumes where it stopped. The analysis is
:mod:`lmrepro.scape.study.report`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.data.stage import data_identity
from lmrepro.evaluation import decay_start
from lmrepro.io import TMP_SUFFIX, atomic_write_json, read_json
from lmrepro.model import ModelConfig
from lmrepro.pipeline.study_engine import LengthStudy, Point, RunDirs, no_study
from lmrepro.runlock import holds_writer_lock
from lmrepro.results import SUMMARY
from lmrepro.rundirs import prepare_runs_dir, run_path, seed_dir
from lmrepro.scape.config import (ScalingAblation, ScalingStudy, ScapeConfig, ScapeRun,
                                  ScapeSuite)
from lmrepro.scape.study.branches import branch_points, branch_settings, run_branch
from lmrepro.scape.train.launch import run_scape_suite

log = logging.getLogger(__name__)

#: the worker-count study's folder in the stage directory
WORKERS = "workers"
#: the decay branches' folder in the stage directory (:mod:`lmrepro.scape.study.branches`)
BRANCHES = "branches"


def scaled_settings(base: ScapeConfig, steps: int, warmup_fraction: float,
                    sparsity_warmup_fraction: float, curve_points: int = 0) -> ScapeConfig:
    """``base`` at ``steps`` optimizer steps with its warm-ups as fractions of the run, and
    ``curve_points`` evaluations along it (:func:`curve_steps`); no checkpoints more often than
    a quarter of the run (the study resumes per run)."""
    return base.replace(steps=steps, warmup_steps=round(warmup_fraction * steps),
                        sparsity_warmup_steps=round(sparsity_warmup_fraction * steps),
                        checkpoint_every=max(base.checkpoint_every, steps // 4),
                        eval_at=curve_steps(base, steps, curve_points))


def curve_steps(base: ScapeConfig, steps: int, points: int) -> list[int]:
    """``points`` log-spaced step counts from 1 % of the run to the start of its lr decay
    (``wsd``; the stable phase, whose lr does not depend on the run's length) or to its end
    (cosine), distinct and below ``steps``."""
    if points <= 0:
        return []
    end = decay_start(steps, base.decay_fraction) if base.lr_schedule == "wsd" else steps - 1
    grid = np.geomspace(max(1, steps // 100), end, points)
    return sorted({int(round(x)) for x in grid if 1 <= round(x) < steps})


def ablation_settings(settings: ScapeConfig, ab: ScalingAblation) -> ScapeConfig:
    """The settings of one ablation run (the study's, with what the ablation changes)."""
    changes: dict[str, Any] = {}
    if ab.weight_decay is not None:
        changes["weight_decay"] = ab.weight_decay
    if ab.sparsity_warmup_fraction is not None:
        changes["sparsity_warmup_steps"] = round(ab.sparsity_warmup_fraction * settings.steps)
    return settings.replace(**changes)


def ablation_run(runs: list[ScapeRun], ab: ScalingAblation) -> ScapeRun:
    base = next(r for r in runs if r.run_name == ab.run)
    return base.replace(name=ab.name, **({"decay_scope": ab.decay_scope}
                                         if ab.decay_scope is not None else {}))


REUSED = "reused.json"


def reuse_run(src: Path, dst: Path, name: str) -> None:
    """Copy the finished run ``src`` (not its checkpoints) to ``dst`` under the run name
    ``name`` (the summary's ``name`` and ``config.run.name``), recording where it came from
    (``reused.json``). The summary is written last: an interrupted copy is not a finished run."""
    tmp = dst.with_name(dst.name + ".copying" + TMP_SUFFIX)     # ignored by git and DVC
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in (SUMMARY,) and not f.name.startswith("."):
            shutil.copy2(f, tmp / f.name)
    summary = read_json(src / SUMMARY)
    summary["name"] = name
    summary.setdefault("config", {}).setdefault("run", {})["name"] = name
    atomic_write_json(tmp / REUSED, {"from": str(src), "name": summary.get("name"),
                                     "why": "the sweep's winner at a verdict seed: the same "
                                            "settings, seed and lr (reuse_sweep_seed)"})
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    atomic_write_json(dst / SUMMARY, summary)


class ScapeStudy:
    """What SCAPE supplies to the study engine (:class:`lmrepro.pipeline.study_engine.StudyWing`):
    its runs by size, and each point trained as one distributed suite per seed."""

    def __init__(self, study: ScalingStudy, base: ScapeConfig, corpus: str, world_size: int,
                 prepared_dir: str | Path, stage_dir: str | Path) -> None:
        self.study, self.base, self.corpus, self.world = study, base, corpus, world_size
        self.corpus_dir = Path(prepared_dir) / corpus
        self.data = data_identity(prepared_dir, corpus)
        self.stage = Path(stage_dir)

    def settings(self, steps: int) -> ScapeConfig:
        s = self.study
        return scaled_settings(self.base, steps, s.warmup_fraction, s.sparsity_warmup_fraction,
                               s.curve_points)

    def runs(self, size: str) -> list[ScapeRun]:
        return list(self.study.runs[size])

    def name(self, run: ScapeRun) -> str:
        return run.run_name

    def lr(self, run: ScapeRun) -> float:
        return run.lr_or(self.base.lr)

    def at_lr(self, run: ScapeRun, lr: float) -> ScapeRun:
        return run.replace(lr=lr)

    def variant(self, run: ScapeRun, lr: float) -> ScapeRun:
        return run.replace(name=f"{run.run_name}@lr{lr:.3g}", lr=lr)

    def train(self, points: Sequence[Point[ScapeRun]]) -> list[RunDirs]:
        return [self._point(p.kind, p.size, p.steps, p.runs, self.settings(p.steps), p.seeds)
                for p in points]

    def branch_points(self) -> list[int]:
        """The verdict point's branch points (``branches``; none without)."""
        s = self.study
        if s.branches is None:
            return []
        return branch_points(s.verdict_steps, self.base.decay_fraction,
                             round(s.branches.first_fraction * s.verdict_steps),
                             s.branches.points)

    def _keeps(self, kind: str, size: str, steps: int) -> bool:
        s = self.study
        return kind == "runs" and s.branches is not None and \
            (size, steps) == (s.verdict_size, s.verdict_steps)

    def extras(self, verdict_runs: list[ScapeRun]) -> dict[str, Path]:
        """The ablations at the verdict point, each varying one run of ``verdict_runs``, then
        the decay branches of its stable runs (``branches``)."""
        s = self.study
        out: dict[str, Path] = {}
        for ab in s.ablations:
            settings = ablation_settings(self.settings(s.verdict_steps), ab)
            kind = f"ablations/{ab.name}"
            dirs = self._point(kind, s.verdict_size, s.verdict_steps,
                               [ablation_run(verdict_runs, ab)], settings, s.ablation_seeds,
                               {"ablation": ab.to_dict()})
            out.update({f"ablation/{d.relative_to(self.stage / kind)}": d
                        for d in dirs.values()})
        if s.branches is not None:
            out.update(self._branches(verdict_runs))
        return out

    def _branches(self, verdict_runs: list[ScapeRun]) -> dict[str, Path]:
        """Each branch point of each branching run and verdict seed: the branch at ``at`` in
        ``<stage>/branches/<size>/L<at + decay>/seed<N>/<run>/`` (its folder named by its total
        length, as a point of its own), point by point, so an interrupted study has every run's
        shortest branches first."""
        s = self.study
        assert s.branches is not None
        size, steps = s.verdict_size, s.verdict_steps
        stable = self.settings(steps).replace(keep_checkpoints_at=self.branch_points())
        runs = [r for r in verdict_runs if r.run_name in s.branches.runs]
        parents = self.stage / "runs" / size / f"L{steps}"
        out: dict[str, Path] = {}
        for at in self.branch_points():
            total = branch_settings(stable, at).steps
            root = prepare_runs_dir(self.stage / BRANCHES / size / f"L{total}", self._identity(
                size, runs, stable, {"branch_point": at, "stable_steps": steps}))
            for seed in s.verdict_seeds:
                for run in runs:
                    d = run_branch(self.corpus_dir, run_path(parents, seed, run.run_name),
                                   run_path(root, seed, run.run_name), stable, run,
                                   s.sizes[size], at, self.world, seed=seed, corpus=self.corpus)
                    out[f"branch/{d.relative_to(self.stage / BRANCHES)}"] = d
        return out

    def _point(self, kind: str, size: str, steps: int, runs: list[ScapeRun],
               settings: ScapeConfig, seeds: list[int], extra: dict[str, Any] | None = None
               ) -> RunDirs:
        model = self.study.sizes[size]
        if self._keeps(kind, size, steps):      # the stable runs the branches start from
            settings = settings.replace(keep_checkpoints_at=self.branch_points())
        root = prepare_runs_dir(self.stage / kind / size / f"L{steps}",
                                self._identity(size, runs, settings, extra))
        # a sweep run kept no branch-point checkpoints: with branches, the verdict runs train
        if kind == "runs" and self.study.reuse_sweep_seed and not settings.keep_checkpoints_at \
                and (size, steps) == (self.study.verdict_size, self.study.verdict_steps):
            self._reuse_winners(root, runs)
        out: RunDirs = {}
        for seed in seeds:
            dirs = run_scape_suite(self.corpus_dir, root / seed_dir(seed), settings, runs, model,
                                   self.world, seed=seed, corpus=self.corpus)
            out.update({(run.run_name, seed): d for run, d in zip(runs, dirs)})
        return out

    def _reuse_winners(self, root: Path, runs: list[ScapeRun]) -> None:
        """With ``reuse_sweep_seed``: each sweep winner's finished run becomes the verdict
        point's run of the sweep's seed (the same settings, seed and lr: the same training;
        only its name differs), so that seed is not trained twice."""
        s = self.study
        sweep = self.stage / "sweep" / s.verdict_size / f"L{s.verdict_steps}"
        for run in runs:
            src = run_path(sweep, s.sweep_seed, self.variant(run, self.lr(run)).run_name)
            dst = run_path(root, s.sweep_seed, run.run_name)
            if (src / SUMMARY).exists() and not (dst / SUMMARY).exists():
                reuse_run(src, dst, run.run_name)

    def _identity(self, size: str, runs: list[ScapeRun], settings: ScapeConfig,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
        # a knob left unset trains as before the knob existed: leaving it out keeps the runs
        # made before it
        return {"model": self.study.sizes[size].to_dict(), "settings": settings.to_dict(),
                "runs": [{k: v for k, v in r.to_dict().items() if v is not None}
                         for r in runs], "world_size": self.world,
                "corpus": self.corpus, "data": self.data, **(extra or {})}


@holds_writer_lock("stage_dir")
def run_study(suite: ScapeSuite, model: ModelConfig, prepared_dir: str | Path,
              stage_dir: str | Path = "results/scaling") -> dict[str, Path]:
    """Run or resume ``suite.scaling`` (the suite's shared settings, corpus and world size);
    returns every finished run directory by label. ``model`` is unused (each size is its own)."""
    assert suite.scaling is not None
    Path(stage_dir).mkdir(parents=True, exist_ok=True)
    wing = ScapeStudy(suite.scaling, suite.settings, suite.corpus, suite.world_size,
                      prepared_dir, stage_dir)
    return LengthStudy(suite.scaling, wing, stage_dir,
                       sweep_runs=suite.scaling.sweep_runs).run()


def scaling_stage(suite: ScapeSuite, prepared_dir: str | Path,
                  stage_dir: str | Path = "results/scaling") -> dict[str, Path]:
    """The ``train_scaling`` stage: the study of ``suite.scaling`` (run or resumed), or, in a
    profile without one, a plan saying so (the stage's outputs always exist); then the
    worker-count study of ``suite.workers``, when the profile has one, in ``<stage>/workers``
    (:mod:`lmrepro.scape.study.workers`)."""
    runs = (no_study(stage_dir) if suite.scaling is None
            else run_study(suite, ModelConfig(), prepared_dir, stage_dir))
    if suite.workers is not None:
        from lmrepro.scape.study.workers import run_workers_study

        run_workers_study(suite, prepared_dir, Path(stage_dir) / WORKERS)
    return runs
