"""The ``train_scape`` pipeline stage: the learning-rate sweep (when the profile asks for it),
then the suite of the ``scape:`` section on one corpus, under torchrun."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

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
              prepared_dir: str | Path, stage_dir: str | Path = "results/scape"
              ) -> dict[str, Path]:
    """Dense AdamW/AdamS, SCAPE, its ablation and top-k runs of ``suite`` with the same data,
    steps, clipping, weight-decay groups and schedule, each at its learning rate, once per seed
    into ``runs/<corpus>/seed<N>/<run>`` (finished runs are skipped); ``model`` unless the
    section overrides it. Writes the DVC metrics and plots."""
    stage_dir = Path(stage_dir)
    model = suite.model or model
    train, val = load_splits(prepared_dir, suite.corpus)   # every check before any move
    check_context(min(len(train), len(val)), model.context)
    runs = suite_runs(suite, model, prepared_dir, stage_dir)
    section = {k: v for k, v in suite.to_dict().items() if k not in ("sweep", "scaling")}
    section["runs"] = [r.to_dict() for r in runs]
    # seeds are not part of the identity: adding one keeps the other seeds' finished runs
    prepare_runs_dir(stage_dir / "runs", {"model": model.to_dict(), "scape": section,
                                          "data": data_identity(prepared_dir, suite.corpus)})
    log.info("SCAPE suite: %d runs x %d workers x seeds %s on %s -> %s (lrs %s)", len(runs),
             suite.world_size, list(seeds), suite.corpus, stage_dir / "runs",
             {r.run_name: r.lr_or(suite.lr) for r in runs})
    out: dict[str, Path] = {}
    for seed in seeds:
        dirs = run_scape_suite(Path(prepared_dir) / suite.corpus,
                               stage_dir / "runs" / suite.corpus / seed_dir(seed),
                               suite.settings, runs, model, suite.world_size, seed=seed,
                               corpus=suite.corpus)
        out.update({run_label(suite.corpus, seed, d.name): d for d in dirs})
    write_stage_products(stage_dir, out)
    return out
