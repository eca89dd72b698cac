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

import json
import logging
from pathlib import Path

from lmrepro.config import Params
from lmrepro.results import collect_runs, write_stage_products
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
        optimizer_impl=t.optimizer_impl, compile=t.compile,
    )


def reset_if_changed(runs_dir: Path, identity: dict) -> None:
    """Keep ``runs_dir`` (finished runs, checkpoints) only if it was made by the same
    configuration and data; otherwise remove it, so a changed parameter never reuses stale runs.

    ``identity`` holds the relevant parameter sections and the prepared data's manifests; it is
    stored as ``runs_dir/identity.json``. DVC keeps run directories (``persist: true``) so that an
    interrupted stage resumes; this check is what makes that safe.
    """
    import shutil

    from lmrepro.io import atomic_write_json, read_json

    marker = runs_dir / "identity.json"
    identity = json.loads(json.dumps(identity, sort_keys=True, default=str))
    if runs_dir.exists() and (not marker.exists() or read_json(marker) != identity):
        log.info("%s was made by another configuration or data: starting afresh", runs_dir)
        shutil.rmtree(runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(marker, identity)


def data_identity(params: Params, corpus: str) -> dict:
    """The prepared corpus's manifest (checksums of every split)."""
    from lmrepro.io import read_json

    return read_json(Path(params.data.prepared_dir) / corpus / "manifest.json")


def baseline_stage(params: Params, stage_dir: str | Path = "results/baseline",
                   progress: bool = True) -> dict[str, dict]:
    """Single-process global-backprop AdamW runs, one per corpus in ``train.corpora``."""
    stage_dir = Path(stage_dir)
    reset_if_changed(stage_dir / "runs", {
        "seed": params.seed, "model": params.model.model_dump(),
        "train": params.train.model_dump(),
        "data": {c: data_identity(params, c) for c in params.train.corpora}})
    out, runs = {}, {}
    for corpus in params.train.corpora:
        train, val = corpus_splits(params, corpus)
        run_dir = stage_dir / "runs" / corpus / "backprop"
        out[corpus] = train_single(params.model.config(), train_settings(params), train, val,
                                   run_dir, corpus=corpus, name="backprop", progress=progress)
        runs[f"{corpus}/backprop"] = run_dir
    write_stage_products(stage_dir, runs)
    return out


def scape_stage(params: Params, stage_dir: str | Path = "results/scape") -> dict[str, Path]:
    """SCAPE 90 %/99 %, top-k 99 % and dense AdamW/AdamS under torchrun (``scape:`` section)."""
    from lmrepro.dist.launch import run_scape_suite, suite_from_section

    sc = params.scape
    stage_dir = Path(stage_dir)
    model = (sc.model or params.model).model_dump()
    reset_if_changed(stage_dir / "runs", {"seed": params.seed, "model": model,
                                          "scape": sc.model_dump(),
                                          "data": data_identity(params, sc.corpus)})
    runs, common, world = suite_from_section(sc.model_dump(exclude={"model"}), model,
                                             params.seed)
    corpus_dir = Path(params.data.prepared_dir) / sc.corpus
    log.info("SCAPE suite: %d runs x %d workers on %s -> %s", len(runs), world, sc.corpus,
             stage_dir / "runs")
    dirs = run_scape_suite(corpus_dir, stage_dir / "runs" / sc.corpus, runs, world, common)
    out = {f"{sc.corpus}/{d.name}": d for d in dirs}
    write_stage_products(stage_dir, out)
    return out


def rgc_stage(params: Params, stage_dir: str | Path = "results/rgc") -> dict[str, Path]:
    """Async RGC, sync RGC and global backprop per corpus in ``rgc.corpora`` (``rgc:``)."""
    from lmrepro.rgc import run_suite

    rg = params.rgc
    stage_dir = Path(stage_dir)
    config = rg.config(params.seed)
    reset_if_changed(stage_dir / "runs", {
        "seed": params.seed, "rgc": rg.model_dump(),
        "data": {c: data_identity(params, c) for c in rg.corpora}})
    for corpus in rg.corpora:
        train, val = corpus_splits(params, corpus)
        log.info("RGC suite %s on %s -> %s", list(rg.executors), corpus,
                 stage_dir / "runs" / corpus)
        run_suite(train, val, corpus, stage_dir / "runs" / corpus, config, rg.executors)
    out = collect_runs(stage_dir / "runs")
    write_stage_products(stage_dir, out)
    return out


def report_stage(params_file: str | Path = "params.yaml", reports_dir: str | Path = "reports",
                 profile: str | None = None) -> Path:
    """``reports/index.html``: every rendered notebook, provenance and how to cite."""
    from lmrepro.pipeline.params import load_params
    from lmrepro.pipeline.report import build_index

    params = load_params(params_file, profile)
    manifests = [Path(params.data.prepared_dir) / name / "manifest.json"
                 for name in params.data.use]
    return build_index(reports_dir, params_file, manifests, "CITATION.cff",
                       out=Path(reports_dir) / "index.html")
