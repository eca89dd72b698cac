"""The ``train_scape`` stage: the suite of the ``scape:`` section on one corpus, under torchrun."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from lmrepro.data.batches import check_context
from lmrepro.data.stage import data_identity, load_splits
from lmrepro.model import ModelConfig
from lmrepro.results import holds_writer_lock, prepare_runs_dir, seed_dir, write_stage_products
from lmrepro.scape.config import ScapeSuite
from lmrepro.scape.launch import run_scape_suite

log = logging.getLogger(__name__)


@holds_writer_lock("stage_dir")
def run_suite(suite: ScapeSuite, model: ModelConfig, seeds: Sequence[int],
              prepared_dir: str | Path, stage_dir: str | Path = "results/scape"
              ) -> dict[str, Path]:
    """Dense AdamW/AdamS, SCAPE and top-k runs of ``suite`` with the same data and steps, once
    per seed into ``runs/<corpus>/seed<N>/<run>`` (finished runs are skipped); ``model`` unless
    the section overrides it. Writes the DVC metrics and plots."""
    stage_dir = Path(stage_dir)
    model = suite.model or model
    train, val = load_splits(prepared_dir, suite.corpus)   # every check before any move
    check_context(min(len(train), len(val)), model.context)
    # seeds are not part of the identity: adding one keeps the other seeds' finished runs
    prepare_runs_dir(stage_dir / "runs", {"model": model.to_dict(), "scape": suite.to_dict(),
                                          "data": data_identity(prepared_dir, suite.corpus)})
    log.info("SCAPE suite: %d runs x %d workers x seeds %s on %s -> %s", len(suite.runs),
             suite.world_size, list(seeds), suite.corpus, stage_dir / "runs")
    out: dict[str, Path] = {}
    for seed in seeds:
        where = f"{suite.corpus}/{seed_dir(seed)}"
        dirs = run_scape_suite(Path(prepared_dir) / suite.corpus, stage_dir / "runs" / where,
                               suite.settings, suite.runs, model, suite.world_size, seed=seed,
                               corpus=suite.corpus)
        out.update({f"{where}/{d.name}": d for d in dirs})
    write_stage_products(stage_dir, out)
    return out
