"""The ``train_baseline`` stage: one single-process global-backprop run per corpus."""

from __future__ import annotations

from pathlib import Path

from lmrepro.baseline.config import BaselineSuite
from lmrepro.baseline.trainer import train_single
from lmrepro.data.batches import check_context
from lmrepro.data.stage import data_identity, load_splits
from lmrepro.model import ModelConfig
from lmrepro.results import holds_writer_lock, prepare_runs_dir, write_stage_products


@holds_writer_lock("stage_dir")
def run_suite(suite: BaselineSuite, model: ModelConfig, seed: int, prepared_dir: str | Path,
              stage_dir: str | Path = "results/baseline", progress: bool = True
              ) -> dict[str, dict]:
    """Train ``model`` on every corpus of ``suite.corpora`` into
    ``stage_dir/runs/<corpus>/backprop``
    (resuming from checkpoints); write the stage's DVC metrics and plots; return the summaries."""
    stage_dir = Path(stage_dir)
    splits = {c: load_splits(prepared_dir, c) for c in suite.corpora}
    for train, val in splits.values():      # every check before prepare_runs_dir moves anything
        check_context(min(len(train), len(val)), model.context)
    prepare_runs_dir(stage_dir / "runs", {
        "seed": seed, "model": model.to_dict(), "train": suite.to_dict(),
        "data": {c: data_identity(prepared_dir, c) for c in suite.corpora}})
    out, runs = {}, {}
    for corpus in suite.corpora:
        train, val = splits[corpus]
        run_dir = stage_dir / "runs" / corpus / "backprop"
        out[corpus] = train_single(model, suite, train, val, run_dir, seed=seed, corpus=corpus,
                                   name="backprop", progress=progress)
        runs[f"{corpus}/backprop"] = run_dir
    write_stage_products(stage_dir, runs)
    return out
