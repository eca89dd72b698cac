"""Figures of SCAPE's training-length study (:mod:`lmrepro.scape.scaling_report`)."""

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
    """SCAPE's mask diagnostics over training at the verdict point (seed-mean, moving
    average): the fraction of the mask kept from the step before, and the normalised step size
    of coordinates that (re-)enter the mask against those that stayed."""
    sel = runs[(runs.kind == "runs") & (runs["size"] == size) & (runs.steps == steps)
               & (runs.method == "scape")]
    fig = Figure(figsize=(12, 4))
    a1, a2 = fig.subplots(1, 2)
    for name, g in sel.groupby("run", sort=True):
        frames = [pd.DataFrame([r for r in load_run(p, p).metrics if "mask_kept" in r])
                  for p in g.path]
        df = pd.concat(frames).groupby("step").mean(numeric_only=True)
        col = COLOURS.get(name)
        a1.plot(df.index, df.mask_kept.rolling(window, min_periods=1).mean(), color=col,
                label=name)
        a2.plot(df.index, df.step_enter.rolling(window, min_periods=1).mean(), color=col,
                label=f"{name}: entering")
        a2.plot(df.index, df.step_stay.rolling(window, min_periods=1).mean(), color=col,
                ls="--", label=f"{name}: staying")
    a1.set_title("fraction of the mask kept from the previous step")
    a2.set_title("mean |normalised step| (the step is lr x this)")
    for ax in (a1, a2):
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
