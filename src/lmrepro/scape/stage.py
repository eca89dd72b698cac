"""The ``train_scape`` pipeline stage: the learning-rate sweep (when the profile asks for it),
then the suite of the ``scape:`` section on one corpus, under torchrun."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from lmrepro.cluster.config import LauncherConfig
from lmrepro.data.batches import check_context
from lmrepro.data.stage import data_identity, load_splits
from lmrepro.model import ModelConfig
from lmrepro.runlock import holds_writer_lock
from lmrepro.pipeline.stage_products import write_stage_products
from lmrepro.rundirs import prepare_runs_dir, run_label, seed_dir
from lmrepro.scape.config import ScapeRun, ScapeSuite
from lmrepro.scape.train.launch import run_scape_suite
from lmrepro.scape.train.sweep import apply_best, run_sweep

log = logging.getLogger(__name__)


def suite_runs(suite: ScapeSuite, model: ModelConfig, prepared_dir: str | Path,
               stage_dir: str | Path = "results/scape") -> list[ScapeRun]:
    """The suite's runs at their learning rates: the sweep's winners when the section has a
    sweep with ``apply`` (the sweep is run or resumed first, once for every seed of the suite:
    it uses its own seed), else their own."""
    stage_dir = Path(stage_dir)
    table = run_sweep(suite, model, prepared_dir, stage_dir,
                      {"model": model.to_dict(),
                       "data": data_identity(prepared_dir, suite.corpus)})
    if suite.sweep is None or not suite.sweep.apply:
        return list(suite.runs)
    if table["on_edge"]:
        log.warning("SCAPE sweep: the best lr of %s is on the grid's edge (%s); the optimum "
                    "may lie beyond", table["on_edge"], suite.sweep.lrs)
    return apply_best(suite.runs, table["best"])


@holds_writer_lock("stage_dir")
def run_suite(suite: ScapeSuite, model: ModelConfig, seeds: Sequence[int],
              prepared_dir: str | Path, stage_dir: str | Path = "results/scape",
              launcher: LauncherConfig | None = None) -> dict[str, Path]:
    """Dense AdamW/AdamS, SCAPE, its ablation and top-k runs of ``suite`` with the same data,
    steps, clipping, weight-decay groups and schedule, each at its learning rate, once per seed
    into ``runs/<corpus>/seed<N>/<run>`` (finished runs are skipped); ``model`` unless the
    section overrides it. Writes the DVC metrics and plots. ``launcher``: where the runs
    execute (:mod:`lmrepro.cluster`; default local, one after another; slurm: every run one
    job, ``launcher.slurm.nodes`` nodes of ``world_size`` workers each)."""
    launcher = launcher or LauncherConfig()
    nodes = launcher.slurm.nodes if launcher.kind == "slurm" else 1
    stage_dir = Path(stage_dir)
    model = suite.model or model
    train, val = load_splits(prepared_dir, suite.corpus)   # every check before any move
    check_context(min(len(train), len(val)), model.context)
    runs = suite_runs(suite, model, prepared_dir, stage_dir)
    section = {k: v for k, v in suite.to_dict().items() if k not in ("sweep", "scaling")}
    section["runs"] = [r.to_dict() for r in runs]
    # seeds are not part of the identity: adding one keeps the other seeds' finished runs
    identity = {"model": model.to_dict(), "scape": section,
                "data": data_identity(prepared_dir, suite.corpus)}
    if nodes > 1:       # world_size workers on each node: another run than one node's
        identity["nodes"] = nodes
    prepare_runs_dir(stage_dir / "runs", identity)
    log.info("SCAPE suite: %d runs x %d workers x seeds %s on %s -> %s (lrs %s)", len(runs),
             suite.world_size, list(seeds), suite.corpus, stage_dir / "runs",
             {r.run_name: r.lr_or(suite.lr) for r in runs})
    if launcher.kind == "slurm":
        jobs = _as_jobs(suite, model, runs, seeds, Path(prepared_dir), stage_dir, launcher)
        write_stage_products(stage_dir, jobs)
        return jobs
    out: dict[str, Path] = {}
    for seed in seeds:
        dirs = run_scape_suite(Path(prepared_dir) / suite.corpus,
                               stage_dir / "runs" / suite.corpus / seed_dir(seed),
                               suite.settings, runs, model, suite.world_size, seed=seed,
                               corpus=suite.corpus)
        out.update({run_label(suite.corpus, seed, d.name): d for d in dirs})
    write_stage_products(stage_dir, out)
    return out


def _as_jobs(suite: ScapeSuite, model: ModelConfig, runs: Sequence[ScapeRun],
             seeds: Sequence[int], prepared_dir: Path, stage_dir: Path,
             launcher: LauncherConfig) -> dict[str, Path]:
    """Every (seed, run) of the suite one SLURM job (:func:`lmrepro.cluster.jobs.run_jobs`)."""
    from lmrepro.cluster.jobs import run_jobs
    from lmrepro.scape.train.jobs import scape_job

    root = stage_dir / "runs" / suite.corpus
    specs = [scape_job(run_label(suite.corpus, seed, r.run_name), prepared_dir / suite.corpus,
                       root / seed_dir(seed) / r.run_name, suite.world_size, suite.settings,
                       r, model, seed, suite.corpus, launcher.slurm.nodes)
             for seed in seeds for r in runs]
    run_jobs(specs, launcher.slurm, stage_dir / "slurm", what="SCAPE suite")
    return {s.name: s.run_dir for s in specs}
