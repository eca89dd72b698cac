"""The stages of the replication pipeline as plain functions of the validated parameters.

The notebooks under ``notebooks/`` are thin: a parameters cell, one call into this module, then
tables and plots. The CLI calls the same functions. Output layout (all under the repo root):

* ``data/raw/<corpus>/``: downloads and fetched text (cached, checksummed);
* ``data/prepared/<corpus>/{train,val,test}.bin`` + ``manifest.json``;
* ``results/<stage>/runs/<corpus>/<run>/``: one run directory each (see :mod:`lmrepro.results`),
  for the stages ``baseline``, ``scape`` and ``rgc``;
* ``results/<stage>/metrics.json`` (DVC metrics) and ``results/<stage>/loss_curve.csv`` (DVC
  plots), written from the run directories by :func:`write_stage_products`;
* ``reports/``: executed notebooks, their HTML, ``index.html``.

Run directories are DVC outputs with ``persist: true``, so a killed stage resumes from its
checkpoints instead of starting over; a checkpoint of another configuration is ignored.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lmrepro.config import Params
from lmrepro.train import TrainSettings, train_single

log = logging.getLogger(__name__)


def fetch_stage(params: Params) -> dict[str, dict]:
    """Fetch (or find in cache) every corpus the profile uses; return their provenance."""
    from lmrepro.data import fetch_corpus
    from lmrepro.io import atomic_write_json

    out = {}
    for name in params.data.use:
        log.info("fetching corpus %s -> %s", name, params.data.raw_dir)
        out[name] = fetch_corpus(name, params.data.corpora[name], params.data.raw_dir)
    # the record of what this profile fetched (also makes data/raw exist for DVC)
    atomic_write_json(Path(params.data.raw_dir) / "fetched.json", out)
    return out


def prepare_stage(params: Params) -> dict[str, Path]:
    """Prepare each used corpus into uint8 train/val/test files with a manifest."""
    from lmrepro.data import prepare_from_spec

    out = {}
    for name in params.data.use:
        out[name] = prepare_from_spec(name, params.data.corpora[name], params.data.raw_dir,
                                      params.data.prepared_dir)
        log.info("prepared %s -> %s", name, out[name])
    return out


def corpus_splits(params: Params, corpus: str):
    """``(train, val)`` uint8 memmaps of a prepared corpus (checksums verified)."""
    from lmrepro.data import load_split

    root = Path(params.data.prepared_dir) / corpus
    return load_split(root, "train"), load_split(root, "val")


def train_settings(params: Params) -> TrainSettings:
    t = params.train
    return TrainSettings(
        steps=t.steps, batch_size=t.batch_size, lr=t.lr, warmup_steps=t.warmup_steps,
        min_lr_ratio=t.min_lr_ratio, weight_decay=t.weight_decay, beta1=t.beta1, beta2=t.beta2,
        grad_clip=t.grad_clip, eval_every=t.eval_every, eval_batches=t.eval_batches,
        eval_batch_size=t.eval_batch_size, checkpoint_every=t.checkpoint_every,
        log_every=t.log_every, threads=t.threads, seed=params.seed,
    )


def baseline_stage(params: Params, stage_dir: str | Path = "results/baseline",
                   progress: bool = True) -> dict[str, dict]:
    """Single-process global-backprop AdamW runs, one per corpus in ``train.corpora``."""
    stage_dir = Path(stage_dir)
    out, runs = {}, {}
    for corpus in params.train.corpora:
        train, val = corpus_splits(params, corpus)
        run_dir = stage_dir / "runs" / corpus / "backprop"
        out[corpus] = train_single(params.model.config(), train_settings(params), train, val,
                                   run_dir, corpus=corpus, name="backprop", progress=progress)
        runs[f"{corpus}/backprop"] = run_dir
    write_stage_products(stage_dir, runs)
    return out


METRIC_KEYS = ("final_bpb", "tokens_per_s", "mean_step_time_s", "peak_rss_bytes", "steps",
               "tokens")


def write_stage_products(stage_dir: str | Path, runs: dict[str, Path]) -> None:
    """DVC metrics (``metrics.json``: scalars per run) and plots (``loss_curve.csv``)."""
    import csv
    import io

    from lmrepro.io import atomic_write_json, atomic_write_text
    from lmrepro.results import read_run

    metrics, buf = {}, io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["run", "step", "loss"])
    for label, run_dir in sorted(runs.items()):
        run = read_run(run_dir)
        summary = run["summary"]
        metrics[label] = {k: summary[k] for k in METRIC_KEYS if k in summary}
        if "bytes_per_step" in summary:
            metrics[label]["bytes_per_step"] = summary["bytes_per_step"]["total"]
        for rec in run["metrics"]:
            if "loss" in rec:
                writer.writerow([label, rec["step"], f"{rec['loss']:.6f}"])
    atomic_write_json(Path(stage_dir) / "metrics.json", metrics)
    atomic_write_text(Path(stage_dir) / "loss_curve.csv", buf.getvalue())


def report_stage(params_file: str | Path = "params.yaml", reports_dir: str | Path = "reports",
                 profile: str | None = None) -> Path:
    """``reports/index.html``: every rendered notebook, provenance and how to cite."""
    from lmrepro.config import load_params
    from lmrepro.report import build_index

    params = load_params(params_file, profile)
    manifests = [Path(params.data.prepared_dir) / name / "manifest.json"
                 for name in params.data.use]
    return build_index(reports_dir, params_file, manifests, "CITATION.cff",
                       out=Path(reports_dir) / "index.html")
