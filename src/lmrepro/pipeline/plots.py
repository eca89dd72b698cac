"""The analysis figures: matplotlib :class:`~matplotlib.figure.Figure` objects without pyplot
state (seaborn draws on their axes), so building one in a notebook or a pipeline stage leaks no
global figure; :func:`save_figure` writes one as a reproducible PNG."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lmrepro.io import atomic_write_bytes
from lmrepro.pipeline.analysis import (ComparisonOutcome, ComparisonRecord, Runs, bytes_long,
                                       load_runs)

LN2 = math.log(2.0)


def loss_curves_frame(runs: Runs) -> pd.DataFrame:
    """Long form ``run, step, kind, bpb`` from metrics.jsonl: ``train`` rows from ``loss`` (nats,
    converted to bits per byte) and ``eval`` rows from ``eval_bpb``."""
    rows = []
    for run in load_runs(runs).values():
        for rec in run.metrics:
            if "step" not in rec:
                continue
            if "eval_bpb" in rec:
                rows.append({"run": run.name, "step": rec["step"], "kind": "eval",
                             "bpb": float(rec["eval_bpb"])})
            if "loss" in rec:
                rows.append({"run": run.name, "step": rec["step"], "kind": "train",
                             "bpb": float(rec["loss"]) / LN2})
    return pd.DataFrame(rows, columns=["run", "step", "kind", "bpb"])


def plot_loss_curves(runs: Runs, *, title: str = "Loss curves") -> Figure:
    """Training loss (line) and evaluation bits per byte (markers) per run against the step."""
    import seaborn as sns

    df = loss_curves_frame(runs)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    train, ev = df[df.kind == "train"], df[df.kind == "eval"]
    if not train.empty:
        sns.lineplot(data=train, x="step", y="bpb", hue="run", ax=ax, linewidth=1.2)
    if not ev.empty:
        sns.scatterplot(data=ev, x="step", y="bpb", hue="run", ax=ax, marker="o", s=30,
                        legend=train.empty)
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte (train: lines, eval: dots)")
    ax.set_title(title)
    return fig


def plot_bytes_per_step(runs: Runs, *, log: bool = True,
                        title: str = "Bytes per step by kind") -> Figure:
    """Grouped bars: bytes each run's collectives move per step, by kind."""
    import seaborn as sns

    df = bytes_long(runs)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    if not df.empty:
        sns.barplot(data=df, x="run", y="bytes_per_step", hue="kind", ax=ax)
        if log and (df.bytes_per_step > 0).any():
            ax.set_yscale("log")
    ax.set_ylabel("bytes per step")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def plot_bootstrap(outcomes: Sequence[ComparisonOutcome], *, ncols: int = 2) -> Figure:
    """One panel per comparison: the bootstrap distribution behind the verdict's bound (seed
    level with enough seeds, else batch level) of the mean relative difference (percent), the
    margin (red vertical line), the upper bound U (dashed) and mean d (dotted)."""
    import seaborn as sns

    with_result = [o for o in outcomes if o.result is not None]
    n = max(1, len(with_result))
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(5 * ncols, 3.2 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, o in zip(axes, with_result, strict=False):  # spare axes are blanked below
        r = o.result
        sns.histplot(x=r.bootstrap_distribution * 100, bins=60, stat="density", ax=ax,
                     color="tab:blue", alpha=0.5)
        ax.axvline(r.margin * 100, color="tab:red", linewidth=2, label=f"margin {r.margin:.1%}")
        ax.axvline(r.upper_bound * 100, color="black", linestyle="--",
                   label=f"U {r.upper_bound:+.2%}")
        ax.axvline(r.mean_rel_diff * 100, color="gray", linestyle=":",
                   label=f"mean {r.mean_rel_diff:+.2%}")
        ax.set_title(f"{o.record.label}\n{r.verdict} ({r.level}-level bound)", fontsize=8.5)
        ax.set_xlabel("mean relative difference (%)")
        ax.legend(fontsize=7)
    for ax in axes[len(with_result):]:
        ax.set_axis_off()
    return fig


def plot_forest(comparisons: Sequence[ComparisonRecord], *,
                title: str = "Non-inferiority: every comparison") -> Figure:
    """One row per comparison: the mean relative difference (dot) and the one-sided upper bound
    the verdict uses (the bar's end, ``|``), the other level's bound (``x``), the margin (red
    line) and zero (grey); green rows are non-inferior. Diverged candidates are labelled."""
    n = max(1, len(comparisons))
    fig = Figure(figsize=(9, 0.45 * n + 1.4), layout="constrained")
    ax = fig.subplots()
    margins = sorted({c.margin for c in comparisons}) or [0.01]
    for m in margins:
        ax.axvline(m * 100, color="tab:red", linewidth=1.5, label=f"margin {m:.1%}")
    ax.axvline(0.0, color="0.6", linewidth=0.8)
    labels = []
    for i, c in enumerate(reversed(comparisons)):
        labels.append(f"{c.label} [{c.n_seeds} seed{'s' * (c.n_seeds != 1)}]")
        if c.mean_rel_diff is None or c.upper_bound is None:
            ax.annotate("diverged", (0.0, i), xytext=(4, -3), textcoords="offset points",
                        fontsize=8, color="tab:red")
            continue
        colour = "tab:green" if c.non_inferior else "tab:orange"
        mean, upper = c.mean_rel_diff * 100, c.upper_bound * 100
        ax.plot([mean, upper], [i, i], color=colour, linewidth=2.5, solid_capstyle="butt")
        ax.plot([mean], [i], "o", color=colour, markersize=6)
        ax.plot([upper], [i], "|", color="black", markersize=12, markeredgewidth=2)
        other = c.batch_upper_bound if c.level == "seed" else c.seed_upper_bound
        if other is not None:
            ax.plot([other * 100], [i], "x", color="0.3", markersize=6)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(-0.7, max(0.7, len(labels) - 0.3))
    ax.set_xlabel("mean relative difference in eval loss (%)\n"
                  "dot = mean, | = upper bound U of the verdict, x = the other level's U",
                  fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def save_figure(fig: Figure, path: str | Path) -> None:
    """PNG through a temporary file (atomic); fixed metadata so reruns give the same bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())
