"""The worker-count study's figures (:mod:`lmrepro.scape.study.workers_report`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot_gaps(gaps: pd.DataFrame, path: Path) -> None:
    """Each method's gap to dense AdamS against W, with its one-sided t bounds."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for run, g in gaps.groupby("run"):
        g = g.sort_values("workers")
        ax.errorbar(g.workers, g.gap_pct, yerr=[g.gap_pct - g.lower_pct, g.upper_pct - g.gap_pct],
                    marker="o", capsize=3, label=str(run))
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers W (global batch fixed)")
    ax.set_ylabel("test bits/byte vs dense AdamS (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bytes(comm: pd.DataFrame, gaps: pd.DataFrame, path: Path) -> None:
    """Bytes each worker puts on the wire per step against W (log-log), and the gap against
    those bytes (quality per byte)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.0))
    for run, g in comm.groupby("run"):
        g = g.sort_values("workers")
        a.plot(g.workers, g.wire_bytes, marker="o", label=str(run))
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("workers W")
    a.set_ylabel("bytes sent per worker per step")
    a.legend(fontsize=8)
    both = comm.merge(gaps, on=["workers", "run"])
    for run, g in both.groupby("run"):
        b.scatter(g.wire_bytes, g.gap_pct, label=str(run))
        for _, row in g.iterrows():
            b.annotate(f"W={row.workers}", (row.wire_bytes, row.gap_pct), fontsize=7)
    b.set_xscale("log")
    b.axhline(0.0, color="grey", lw=0.8)
    b.set_xlabel("bytes sent per worker per step")
    b.set_ylabel("gap to dense AdamS (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
