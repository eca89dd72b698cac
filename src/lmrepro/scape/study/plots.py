"""Figures of SCAPE's training-length study (:mod:`lmrepro.scape.study.report`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from lmrepro.pipeline import length_plots
from lmrepro.pipeline.runs import load_run

LOG2 = math.log(2)
COLOURS = {"scape90": "tab:blue", "scape99": "tab:orange", "topk99": "tab:red",
           "adams": "black", "adamw": "tab:gray"}


def gap_vs_length(gaps: pd.DataFrame, baseline: str = "adams") -> Figure:
    """Per model size: each sparse method's test-split gap to dense ``baseline`` against
    training length (:func:`lmrepro.pipeline.length_plots.gap_vs_length`)."""
    return length_plots.gap_vs_length(gaps, baseline, COLOURS, f"dense {baseline}")


def verdict_curves(runs: pd.DataFrame, size: str, steps: int,
                   floor: Mapping[str, Any] | None, window: int = 50) -> Figure:
    """Training loss of every method at the verdict point with the n-gram floors
    (:func:`lmrepro.pipeline.length_plots.verdict_curves`)."""
    return length_plots.verdict_curves(runs, size, steps, floor, COLOURS, window)


def diagnostics_curves(runs: pd.DataFrame, size: str, steps: int, window: int = 25) -> Figure:
    """The sparse methods' diagnostics over training at the verdict point (seed-mean, moving
    average): SCAPE's fraction of the mask kept from the step before; the share of the top-k
    tensors' coordinates in the mask at least once in the last 100 steps; the share of the
    step's size that lands off the mask (momentum still moving coordinates no longer sent)."""
    sel = runs[(runs.kind == "runs") & (runs["size"] == size) & (runs.steps == steps)
               & runs.method.isin(("scape", "topk"))]
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    panels = (("mask_kept", "SCAPE: fraction of the mask kept from the previous step"),
              ("recent_coverage", "coordinates in the mask at least once in 100 steps"),
              ("off_mask_mass", "share of the step's size off the mask"))
    for name, g in sel.groupby("run", sort=True):
        frames = [pd.DataFrame([r for r in load_run(p, p).metrics if "sparsity" in r
                                and r["sparsity"] > 0]) for p in g.path]
        frames = [f for f in frames if len(f) and "step" in f]
        if not frames:
            continue
        df = pd.concat(frames).groupby("step").mean(numeric_only=True)
        for ax, (key, _) in zip(axes, panels):
            if key in df:
                ax.plot(df.index, df[key].rolling(window, min_periods=1).mean(),
                        color=COLOURS.get(name), label=name)
    for ax, (_, title) in zip(axes, panels):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figures(runs: pd.DataFrame, gaps: pd.DataFrame, floor: Mapping[str, Any] | None,
            verdict: tuple[str, int]) -> dict[str, Figure]:
    out = {"gap_vs_length": gap_vs_length(gaps)}
    point = runs[(runs.kind == "runs") & (runs["size"] == verdict[0])
                 & (runs.steps == verdict[1])] if len(runs) else runs
    if len(point):
        out["verdict_curves"] = verdict_curves(runs, *verdict, floor)
        out["mask_diagnostics"] = diagnostics_curves(runs, *verdict)
    return out


def save(fig: Figure, path: str | Path) -> None:
    from lmrepro.pipeline.plots import save_figure

    save_figure(fig, path)
