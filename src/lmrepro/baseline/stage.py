"""The ``train_baseline`` stage: one single-process global-backprop run per corpus and seed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lmrepro.baseline.config import BaselineSuite
from lmrepro.baseline.trainer import train_single
from lmrepro.data.batches import check_context
from lmrepro.data.stage import data_identity, load_splits
from lmrepro.model import ModelConfig
from lmrepro.runlock import holds_writer_lock
from lmrepro.results import SUMMARY, read_summary
from lmrepro.pipeline.stage_products import write_stage_products
from lmrepro.rundirs import prepare_runs_dir, run_label


@holds_writer_lock("stage_dir")
def run_suite(suite: BaselineSuite, model: ModelConfig, seeds: Sequence[int],
              prepared_dir: str | Path, stage_dir: str | Path = "results/baseline",
              progress: bool = True) -> dict[str, dict]:
    """Train ``model`` on every corpus of ``suite.corpora`` once per seed into
    ``stage_dir/runs/<corpus>/seed<N>/backprop`` (a finished run is read back, an interrupted
    one resumes from its checkpoint); write the stage's DVC metrics and plots; return the
    summaries by ``<corpus>/seed<N>/backprop``."""
    stage_dir = Path(stage_dir)
    splits = {c: load_splits(prepared_dir, c) for c in suite.corpora}
    for train, val in splits.values():      # every check before prepare_runs_dir moves anything
        check_context(min(len(train), len(val)), model.context)
    # the seeds are not part of the identity: each run's checkpoint carries its own seed, so
    # adding a seed keeps the finished runs of the others
    prepare_runs_dir(stage_dir / "runs", {
        "model": model.to_dict(), "train": suite.to_dict(),
        "data": {c: data_identity(prepared_dir, c) for c in suite.corpora}})
    out, runs = {}, {}
    for corpus in suite.corpora:
        train, val = splits[corpus]
        for seed in seeds:
            label = run_label(corpus, seed, "backprop")
            run_dir = stage_dir / "runs" / label
            out[label] = (read_summary(run_dir).to_json() if (run_dir / SUMMARY).exists()
                          else train_single(model, suite, train, val, run_dir, seed=seed,
                                            corpus=corpus, name="backprop", progress=progress))
            runs[label] = run_dir
    write_stage_products(stage_dir, runs)
    return out
