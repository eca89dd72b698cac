"""Figures every training-length study draws (SCAPE's and RGC's): the gap to the baseline against
training length, and the training curves at the verdict point beside the corpus's n-gram
floors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lmrepro.pipeline.runs import load_run

LOG2 = math.log(2)


def gap_vs_length(gaps: pd.DataFrame, baseline: str, colours: Mapping[str, str],
                  baseline_label: str) -> Figure:
    """Per model size: each candidate's test-split gap to ``baseline`` against training length
    (log axis), the mean over seeds with its one-sided bounds [L, U] as error bars."""
    sizes = sorted(gaps["size"].unique()) if len(gaps) else []
    fig = Figure(figsize=(6 * max(1, len(sizes)) + 1.5, 4.2))
    axes = fig.subplots(1, max(1, len(sizes)), squeeze=False, sharey=True)
    for ax, size in zip(axes[0], sizes):
        g = gaps[(gaps["size"] == size) & (gaps.baseline == baseline) & gaps["mean"].notna()]
        for cand, c in g.groupby("candidate", sort=True):
            c = c.sort_values("steps")
            mean = c["mean"].to_numpy() * 100
            lo = mean - c["lower"].to_numpy() * 100
            hi = c["upper"].to_numpy() * 100 - mean
            ax.errorbar(c.steps, mean, yerr=[lo, hi], marker="o", capsize=4, label=cand,
                        color=colours.get(cand))
        ax.axhline(1.0, color="tab:green", ls="--", lw=1, label="1 % margin")
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_xscale("log")
        ax.set_xlabel("training length (optimizer steps, log scale)")
        ax.set_title(f"model {size}: gap to {baseline_label} (test split)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("relative difference in bits/byte (%)\nmean over seeds, bars [L, U]")
    legend: dict[str, Any] = {}     # every method of any panel (a size may lack one)
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        axes[0][-1].legend(list(legend.values()), list(legend), loc="upper left",
                           bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def verdict_curves(runs: pd.DataFrame, size: str, steps: int,
                   floor: Mapping[str, Any] | None, colours: Mapping[str, str],
                   window: int = 50) -> Figure:
    """Training loss (bits/byte, moving average over ``window`` steps, mean over seeds) of every
    method at the verdict point, with the corpus's n-gram floors (validation split) and each
    method's final validation bits/byte as a dot."""
    sel = runs[(runs.kind == "runs") & (runs["size"] == size) & (runs.steps == steps)]
    fig = Figure(figsize=(11, 4.8))
    ax = fig.subplots()
    for name, g in sel.groupby("run", sort=True):
        curves = []
        for p in g.path:
            loss = [r["loss"] for r in load_run(p, p).metrics if "loss" in r]
            curves.append(pd.Series(loss).rolling(window, min_periods=1).mean().to_numpy())
        n = min(len(c) for c in curves)
        mean = np.mean([c[:n] for c in curves], axis=0) / LOG2
        ax.plot(np.arange(n), mean, label=f"{name} ({len(curves)} seed{'s' * (len(curves) != 1)})",
                color=colours.get(name), lw=1.2)
        ax.plot([steps], [g.val_bpb.mean()], "o", color=colours.get(name), ms=5)
    if floor is not None:
        for kind, ls in (("bigram", ":"), ("trigram", "--")):
            ax.axhline(floor[kind]["val"], color="tab:purple", ls=ls, lw=1,
                       label=f"{kind} floor, val ({floor[kind]['val']:.2f})")
    ax.set_ylim(top=4.5)
    ax.set_xlabel("step")
    ax.set_ylabel("bits/byte (training loss; dots: final validation)")
    ax.set_title(f"model {size}, {steps} steps: training loss")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
