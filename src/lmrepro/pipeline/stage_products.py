"""A training stage's DVC products, from its finished runs (:func:`write_stage_products`):
per-run scalars (``metrics.json``), the per-step data plots (``loss_curve.csv``,
``bytes_per_step.csv``) in long form, one row per run, seed and step, so that ``dvc plots show``
draws one line per run and seed (the ``runs`` template under ``.dvc/plots/``), and the stage's
headline metrics (``metrics/train_<stage>/``: :mod:`lmrepro.pipeline.headline`)."""

from __future__ import annotations

from pathlib import Path

from lmrepro.io import atomic_write_json, atomic_write_text
from lmrepro.pipeline.headline import metrics_dir, training_items, write_headline
from lmrepro.results import read_run

METRIC_KEYS = ("final_bpb", "tokens_per_s", "mean_step_time_s", "peak_rss_bytes", "steps",
               "tokens")
#: the columns of the data plots (``run``: the run's name in its suite, the same for every seed)
LOSS_COLUMNS = ["run", "corpus", "seed", "step", "loss"]
BYTES_COLUMNS = ["run", "corpus", "seed", "step", "bytes_total"]


def write_stage_products(stage_dir: str | Path, runs: dict[str, Path]) -> None:
    """DVC metrics (``metrics.json``: scalars per run) and data plots in long form
    (``loss_curve.csv``: the training loss in nats, and ``bytes_per_step.csv`` for runs that
    communicate; columns :data:`LOSS_COLUMNS`, :data:`BYTES_COLUMNS`), and the stage's
    headline metrics (``metrics/train_<stage>/``: :mod:`lmrepro.pipeline.headline`)."""
    import csv
    import io

    metrics, summaries, losses, comm = {}, [], io.StringIO(), io.StringIO()
    loss_rows = csv.writer(losses, lineterminator="\n")
    loss_rows.writerow(LOSS_COLUMNS)
    comm_rows = csv.writer(comm, lineterminator="\n")
    comm_rows.writerow(BYTES_COLUMNS)
    for label, run_dir in sorted(runs.items()):
        run = read_run(run_dir)
        summary = run["summary"]
        summaries.append(summary)
        key = [summary["name"], summary["corpus"], summary["seed"]]
        metrics[label] = {k: summary[k] for k in METRIC_KEYS}
        if summary.get("bytes_per_step"):
            metrics[label]["bytes_per_step"] = summary["bytes_per_step"]["total"]
        for rec in run["metrics"]:
            if "loss" in rec:
                loss_rows.writerow([*key, rec["step"], f"{rec['loss']:.6f}"])
            if "bytes_total" in rec:
                comm_rows.writerow([*key, rec["step"], rec["bytes_total"]])
    stage_dir = Path(stage_dir)
    write_headline(metrics_dir(stage_dir, f"train_{stage_dir.name}"), training_items(summaries))
    atomic_write_json(stage_dir / "metrics.json", metrics)
    atomic_write_text(stage_dir / "loss_curve.csv", losses.getvalue())
    if any("bytes_per_step" in m for m in metrics.values()):
        atomic_write_text(stage_dir / "bytes_per_step.csv", comm.getvalue())
