"""The learning-rate sweep of the SCAPE suite: each method at its own learning rate.

AdamS's rebuilt second moment is smaller than Adam's where gradients are noisy, so AdamW's
learning rate over-steps it, while sparse methods update each coordinate less often and prefer a
larger one (docs/scape.md, "The algorithm as implemented"): comparing every method at one
learning rate measures the learning rate, not the method. The sweep runs every run of the suite
at every value of ``scape.sweep.lrs`` (a log-spaced grid), with the suite's settings but
``sweep.steps`` steps and the seed ``sweep.seed`` (one the suite does not use), and picks per run
the value with the lowest final validation bits per byte; a diverged run never wins. The winners
are then the runs' ``lr`` in the suite (``sweep.apply``). A winner on the grid's edge is flagged:
the optimum may lie beyond it.

Run directories: ``<stage>/sweep/runs/<corpus>/<run>@lr<lr>/``; the table:
``<stage>/sweep/sweep.json`` and ``sweep.csv`` (written even when the profile has no sweep, so
the stage's outputs always exist).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmrepro.errors import check
from lmrepro.io import atomic_write_json, atomic_write_text, read_json
from lmrepro.model import ModelConfig
from lmrepro.results import SUMMARY, read_summary
from lmrepro.rundirs import prepare_runs_dir
from lmrepro.scape.config import ScapeRun, ScapeSuite, ScapeSweep
from lmrepro.scape.train.launch import run_scape_suite
from lmrepro.sweep import select_best


SWEEP_DIR = "sweep"
SWEEP_JSON = "sweep.json"
SWEEP_CSV = "sweep.csv"
COLUMNS = ("run", "method", "sparsity", "lr", "final_bpb", "diverged_at_step", "best")


def sweep_name(run: ScapeRun, lr: float) -> str:
    """The run directory name of ``run`` at ``lr``."""
    return f"{run.run_name}@lr{lr:g}"


def sweep_runs(suite: ScapeSuite) -> list[tuple[ScapeRun, ScapeRun]]:
    """``(suite run, the same run at one grid value)`` for every run and value of the grid."""
    assert suite.sweep is not None
    return [(run, run.replace(name=sweep_name(run, lr), lr=lr))
            for run in suite.runs for lr in suite.sweep.lrs]


def apply_best(runs: Sequence[ScapeRun], best: dict[str, float]) -> list[ScapeRun]:
    """The runs with their sweep winners as their ``lr`` (runs without a winner unchanged)."""
    return [r.replace(lr=best[r.run_name]) if r.run_name in best else r for r in runs]


def sweep_table(rows: Sequence[dict[str, Any]], sweep: ScapeSweep | None) -> dict[str, Any]:
    """``sweep.json``: the grid, every row, the winners and the winners on the grid's edge."""
    best = select_best(rows)
    marked = [{**r, "best": best.get(r["run"]) == r["lr"]} for r in rows]
    return {"sweep": None if sweep is None else sweep.to_dict(), "rows": marked, "best": best,
            "on_edge": sorted(run for run, lr in best.items()
                              if sweep is not None and sweep.on_edge(lr)),
            "all_diverged": sorted({r["run"] for r in rows} - set(best))}


def write_sweep(out_dir: str | Path, table: dict[str, Any]) -> None:
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / SWEEP_JSON, table)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in table["rows"]:
        w.writerow([r[c] if r[c] is not None else "" for c in COLUMNS])
    atomic_write_text(out_dir / SWEEP_CSV, buf.getvalue())


def read_sweep(stage_dir: str | Path = "results/scape") -> dict[str, Any]:
    """The sweep table a stage wrote (``{"sweep": None, "rows": []...}`` without a sweep)."""
    return read_json(Path(stage_dir) / SWEEP_DIR / SWEEP_JSON)


def run_sweep(suite: ScapeSuite, model: ModelConfig, prepared_dir: str | Path,
              stage_dir: str | Path, identity: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) the sweep of ``suite`` under torchrun and write its table; returns it.
    Without ``suite.sweep`` writes an empty table. ``identity``: what else the runs depend on
    (model, data), for :func:`lmrepro.rundirs.prepare_runs_dir`."""
    out_dir = Path(stage_dir) / SWEEP_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    if suite.sweep is None:
        table = sweep_table([], None)
        write_sweep(out_dir, table)
        return table
    sweep = suite.sweep
    check(sweep.seed >= 0, "scape.sweep.seed", sweep.seed, "must be >= 0")
    settings = suite.settings.replace(steps=sweep.steps,
                                      checkpoint_every=min(suite.checkpoint_every, sweep.steps))
    runs_dir = prepare_runs_dir(out_dir / "runs", {
        **identity, "sweep": {k: v for k, v in sweep.to_dict().items() if k != "apply"},
        "settings": settings.to_dict(),
        "runs": [r.replace(lr=None).to_dict() for r in suite.runs],
        "world_size": suite.world_size, "corpus": suite.corpus})
    pairs = sweep_runs(suite)
    dirs = run_scape_suite(Path(prepared_dir) / suite.corpus, runs_dir / suite.corpus, settings,
                           [r for _, r in pairs], model, suite.world_size, seed=sweep.seed,
                           corpus=suite.corpus)
    rows = []
    for (run, at), d in zip(pairs, dirs):
        s = read_summary(d) if (d / SUMMARY).exists() else None
        check(s is not None, "sweep run", str(d), "must have finished (summary.json)")
        assert s is not None and at.lr is not None
        rows.append({"run": run.run_name, "method": s.method, "sparsity": run.sparsity,
                     "lr": at.lr, "final_bpb": s.final_bpb,
                     "diverged_at_step": s.diverged_at_step})
    table = sweep_table(rows, sweep)
    write_sweep(out_dir, table)
    return table
