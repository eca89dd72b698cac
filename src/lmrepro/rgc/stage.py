"""The ``train_rgc`` stage: async RGC, sync RGC and global backprop on every corpus."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmrepro.cluster.config import LauncherConfig
from lmrepro.data.prepare import load_split
from lmrepro.data.stage import data_identity, load_splits
from lmrepro.runlock import holds_writer_lock
from lmrepro.results import SUMMARY, read_run
from lmrepro.pipeline.stage_products import write_stage_products
from lmrepro.rundirs import prepare_runs_dir, run_label, run_path, seed_dir
from lmrepro.rgc.core.corpus import check_data
from lmrepro.rgc.config import RGCConfig, RGCSuite, check_executor
from lmrepro.rgc.executors.isolated import train_in_fresh_process
from lmrepro.rgc.executors.runner import train

log = logging.getLogger(__name__)

RUN_NAMES = {"async": "rgc-async", "sync": "rgc-sync", "backprop": "backprop"}


def run_executors(train_data: np.ndarray, val_data: np.ndarray, corpus: str,
                  out_root: str | Path, config: RGCConfig,
                  executors: Sequence[str] = ("async", "sync", "backprop"), seed: int = 0,
                  test_data: np.ndarray | None = None, fresh_process: bool = True
                  ) -> dict[str, dict]:
    """Each executor into ``out_root/<name>`` (``rgc-async``, ``rgc-sync``, ``backprop``). A run
    whose ``summary.json`` exists is read back; a run with only a checkpoint resumes.
    ``test_data``: the test split, scored at the end of each run. ``fresh_process``: each run
    in a new interpreter of its own (:mod:`lmrepro.rgc.executors.isolated`), so that no earlier
    run's allocations or torch state count in its memory; False: in this process (the same results).
    Returns ``{executor: summary}``."""
    out_root = Path(out_root)
    summaries: dict[str, dict] = {}
    for executor in executors:
        check_executor(executor)
        run_dir = out_root / RUN_NAMES[executor]
        if not (run_dir / SUMMARY).exists():
            if fresh_process:
                train_in_fresh_process(config, executor, train_data, val_data, run_dir, corpus,
                                       RUN_NAMES[executor], seed, test_data)
            else:
                train(config, executor, train_data, val_data, run_dir, corpus,
                      RUN_NAMES[executor], seed=seed, test_data=test_data)
        summaries[executor] = read_run(run_dir)["summary"]
    return summaries


@holds_writer_lock("stage_dir")
def run_suite(suite: RGCSuite, seeds: Sequence[int], prepared_dir: str | Path,
              stage_dir: str | Path = "results/rgc", launcher: LauncherConfig | None = None
              ) -> dict[str, Path]:
    """The ``rgc:`` section's executors on each of its corpora, once per seed into
    ``runs/<corpus>/seed<N>/<run>``, each run in a fresh process tree of its own
    (:func:`run_executors`); DVC metrics and plots. ``launcher`` slurm: every run a one-node
    SLURM job (:mod:`lmrepro.cluster`) instead."""
    stage_dir = Path(stage_dir)
    splits = {c: load_splits(prepared_dir, c) for c in suite.corpora}
    tests = {c: load_split(Path(prepared_dir) / c, "test") for c in suite.corpora}
    for corpus, (train_data, val_data) in splits.items():   # every check before any move
        check_data(f"{corpus} train split", np.asarray(train_data), suite.model.context)
        check_data(f"{corpus} val split", np.asarray(val_data), suite.model.context)
        check_data(f"{corpus} test split", np.asarray(tests[corpus]), suite.model.context)
    # seeds are not part of the identity: adding one keeps the other seeds' finished runs
    prepare_runs_dir(stage_dir / "runs", {
        "rgc": suite.to_dict(),
        "data": {c: data_identity(prepared_dir, c) for c in suite.corpora}})
    if launcher is not None and launcher.kind == "slurm":
        jobs = _as_jobs(suite, seeds, Path(prepared_dir), stage_dir, launcher)
        write_stage_products(stage_dir, jobs)
        return jobs
    out: dict[str, Path] = {}
    for corpus in suite.corpora:
        train_data, val_data = splits[corpus]
        log.info("RGC suite %s x seeds %s on %s -> %s", list(suite.executors), list(seeds),
                 corpus, stage_dir / "runs" / corpus)
        for seed in seeds:
            run_executors(train_data, val_data, corpus,
                          stage_dir / "runs" / corpus / seed_dir(seed),
                          suite.config, suite.executors, seed, tests[corpus])
            out.update({run_label(corpus, seed, RUN_NAMES[e]):
                        run_path(stage_dir / "runs" / corpus, seed, RUN_NAMES[e])
                        for e in suite.executors})
    write_stage_products(stage_dir, out)
    return out


def _as_jobs(suite: RGCSuite, seeds: Sequence[int], prepared_dir: Path, stage_dir: Path,
             launcher: LauncherConfig) -> dict[str, Path]:
    """Every (corpus, seed, executor) of the suite one SLURM job."""
    from lmrepro.cluster.jobs import run_jobs
    from lmrepro.rgc.executors.slurm_job import rgc_job

    specs = [rgc_job(run_label(corpus, seed, RUN_NAMES[e]), suite.config, e,
                     prepared_dir / corpus, corpus,
                     run_path(stage_dir / "runs" / corpus, seed, RUN_NAMES[e]), RUN_NAMES[e],
                     seed)
             for corpus in suite.corpora for seed in seeds for e in suite.executors]
    run_jobs(specs, launcher.slurm, stage_dir / "slurm", what="RGC suite")
    return {s.name: s.run_dir for s in specs}
