"""The analysis figures: matplotlib :class:`~matplotlib.figure.Figure` objects without pyplot
state (seaborn draws on their axes), so building one in a notebook or a pipeline stage leaks no
global figure; :func:`save_figure` writes one as a reproducible PNG."""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lmrepro.io import atomic_write_bytes
from lmrepro.pipeline import registry
from lmrepro.pipeline.comparisons import ComparisonOutcome
from lmrepro.pipeline.records import ComparisonRecord
from lmrepro.pipeline.resources import bytes_long
from lmrepro.pipeline.runs import Runs, load_runs

LN2 = math.log(2.0)
log = logging.getLogger(__name__)

#: the n-gram floors a loss plot draws (:mod:`lmrepro.data.ngram`): colour and dash pattern
FLOOR_STYLES: dict[str, tuple[str, tuple]] = {"bigram": ("0.45", (0, (7, 3))),
                                              "trigram": ("0.1", (0, (2, 2)))}

Floors = Mapping[str, Mapping[str, float]]


def ngram_floors(prepared_dir: str | Path, corpora: Iterable[str], split: str = "val"
                 ) -> dict[str, dict[str, float]]:
    """``{corpus: {"bigram": bpb, "trigram": bpb}}``: the n-gram floors
    (:func:`lmrepro.data.ngram.corpus_floor`, bits per byte on ``split``) of each corpus prepared
    under ``prepared_dir``; a corpus not prepared there is left out (with a warning)."""
    from lmrepro.data.ngram import corpus_floor
    from lmrepro.data.prepare import MANIFEST

    out: dict[str, dict[str, float]] = {}
    for corpus in sorted(set(corpora)):
        where = Path(prepared_dir) / corpus
        if not (where / MANIFEST).is_file():
            log.warning("no prepared corpus at %s: its loss plot has no n-gram floor", where)
            continue
        floor = corpus_floor(where)
        out[corpus] = {name: float(floor[name][split]) for name in FLOOR_STYLES}
    return out


def loss_curves_frame(runs: Runs) -> pd.DataFrame:
    """Long form ``run, group, corpus, seed, step, kind, bpb`` from metrics.jsonl: ``train``
    rows from ``loss`` (nats, converted to bits per byte) and ``eval`` rows from ``eval_bpb``
    (bits per byte on the validation split); a run whose metrics hold no evaluation at its last
    step gets one from its summary's ``final_bpb``. ``group`` is the run's name in its suite
    (the same for every seed)."""
    rows = []
    for run in load_runs(runs).values():
        s = run.summary
        key = {"run": run.name, "group": s.name, "corpus": s.corpus, "seed": s.seed}
        eval_steps = set()
        for rec in run.metrics:
            if "step" not in rec:
                continue
            if "eval_bpb" in rec:
                eval_steps.add(rec["step"])
                rows.append({**key, "step": rec["step"], "kind": "eval",
                             "bpb": float(rec["eval_bpb"])})
            if "loss" in rec:
                rows.append({**key, "step": rec["step"], "kind": "train",
                             "bpb": float(rec["loss"]) / LN2})
        if s.final_bpb is not None and not any(step >= s.steps for step in eval_steps):
            rows.append({**key, "step": s.steps, "kind": "eval", "bpb": float(s.final_bpb)})
    return pd.DataFrame(rows, columns=["run", "group", "corpus", "seed", "step", "kind", "bpb"])


def _palette(groups: Sequence[str]) -> dict[str, Any]:
    import seaborn as sns

    return dict(zip(groups, sns.color_palette("tab10" if len(groups) <= 10 else "husl",
                                              len(groups)), strict=True))


def _y_range(curves: Sequence[np.ndarray], fixed: Sequence[float]) -> tuple[float, float, bool]:
    """Limits that show where the curves settle: the top is the highest value after the first
    tenth of each curve (the early steps above it are cut); the bottom takes every curve and
    every fixed value (dots, floors). Returns (bottom, top, whether the top cuts a curve)."""
    tails = [c[len(c) // 10:] for c in curves if len(c)]
    highs = [float(np.nanmax(t)) for t in tails if len(t)] + list(fixed)
    lows = [float(np.nanmin(c)) for c in curves if len(c)] + list(fixed)
    if not highs:
        return 0.0, 1.0, False
    hi, lo = max(highs), min(lows)
    pad = 0.06 * max(hi - lo, 1e-3)
    top = hi + pad
    cut = any(float(np.nanmax(c)) > top for c in curves if len(c))
    return lo - pad, top, cut


def plot_loss_curves(runs: Runs, *, title: str = "Loss curves", floors: Floors | None = None,
                     floor_split: str = "val", prepared_dir: str | Path | None = None) -> Figure:
    """Bits per byte against the step, one panel per corpus: per group of runs (the same run
    name over seeds), the training loss (a line: the mean over seeds, a light band from the
    lowest to the highest seed), the validation evaluations (dots, every seed) and, from
    ``floors`` (``{corpus: {"bigram": bpb, "trigram": bpb}}``, :func:`ngram_floors`), the n-gram
    floors as labelled horizontal lines (``prepared_dir`` instead: the floors of the runs'
    corpora prepared there). One legend entry per group, below the panels."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory

    df = loss_curves_frame(runs)
    corpora = sorted(df.corpus.unique()) or [""]
    if floors is None and prepared_dir is not None:
        floors = ngram_floors(prepared_dir, corpora, split=floor_split)
    groups = sorted(df.group.unique())
    colours = _palette(groups)
    fig = Figure(figsize=(9, 3.6 * len(corpora) + 1.3), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(corpora), 1, squeeze=False)).ravel()
    n_seeds = 1
    for ax, corpus in zip(axes, corpora, strict=True):
        here = df[df.corpus == corpus]
        curves, fixed = [], []
        for group in groups:
            train = here[(here.group == group) & (here.kind == "train")]
            if not train.empty:
                by_step = train.groupby("step").bpb
                mean, lo, hi = by_step.mean(), by_step.min(), by_step.max()
                n_seeds = max(n_seeds, train.seed.nunique())
                ax.plot(mean.index, mean.values, color=colours[group], linewidth=1.3, zorder=2)
                if train.seed.nunique() > 1:
                    ax.fill_between(mean.index, lo.values, hi.values, color=colours[group],
                                    alpha=0.15, linewidth=0, zorder=1)
                curves.append(mean.to_numpy())
            ev = here[(here.group == group) & (here.kind == "eval")]
            if not ev.empty:
                ax.scatter(ev.step, ev.bpb, s=30, color=colours[group], edgecolor="black",
                           linewidth=0.6, zorder=4)
                fixed += ev.bpb.tolist()
        text_at = blended_transform_factory(ax.transAxes, ax.transData)
        for name, value in (floors or {}).get(corpus, {}).items():
            colour, dashes = FLOOR_STYLES.get(name, ("0.3", (0, (4, 2))))
            ax.axhline(value, color=colour, linestyle=dashes, linewidth=1.3, zorder=3)
            ax.text(1.005, value, f"{name}\n{value:.2f}", transform=text_at, fontsize=8,
                    va="center", ha="left", color=colour)
            fixed.append(value)
        bottom, top, cut = _y_range(curves, fixed)
        ax.set_ylim(bottom, top)
        ax.set_xlabel("step" + (f"   (the y axis is cut at {top:.2f}: the first steps start "
                                "higher)" if cut else ""))
        ax.set_ylabel("bits per byte")
        ax.set_title(f"{title}: {corpus}" if len(corpora) > 1 and corpus else title)
    handles = [Line2D([], [], color=colours[g], linewidth=2, label=g) for g in groups]
    handles.append(Line2D([], [], linestyle="", marker="o", markerfacecolor="0.6",
                          markeredgecolor="black", label=f"evaluation ({floor_split} split)"))
    if n_seeds > 1:
        handles.append(Patch(color="0.6", alpha=0.3,
                             label=f"training loss: mean of {n_seeds} seeds, band min to max"))
    else:
        handles.append(Line2D([], [], color="0.3", label="training loss (per batch)"))
    if floors:
        handles += [Line2D([], [], color=c, linestyle=d, linewidth=1.3,
                           label=f"{name} floor ({floor_split} split)")
                    for name, (c, d) in FLOOR_STYLES.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)),
               fontsize=8, frameon=False)
    return fig


def plot_step_series(frame: pd.DataFrame, value: str, *, title: str, ylabel: str,
                     log: bool = False) -> Figure:
    """A per-step series of many runs (``frame``: ``run, step, <value>`` with the run's name,
    and its ``seed`` when there are several; or runs labelled ``.../<name>``): one line per run
    name (the mean over its seeds; a light band from the lowest to the highest), the legend
    below the axes."""
    from matplotlib.lines import Line2D

    df = frame.assign(group=[str(r).rsplit("/", 1)[-1] for r in frame.run])
    each = [c for c in ("corpus", "seed") if c in df] or ["run"]
    groups = sorted(df.group.unique())
    colours = _palette(groups)
    fig = Figure(figsize=(9, 4.6), layout="constrained")
    ax = fig.subplots()
    for group in groups:
        by_step = df[df.group == group].groupby("step")[value]
        mean = by_step.mean()
        ax.plot(mean.index, mean.values, color=colours[group], linewidth=1.3)
        if len(df[df.group == group].groupby(each)) > 1:
            ax.fill_between(mean.index, by_step.min().values, by_step.max().values,
                            color=colours[group], alpha=0.15, linewidth=0)
    if log:
        ax.set_yscale("log")
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    fig.legend(handles=[Line2D([], [], color=colours[g], linewidth=2, label=g) for g in groups],
               loc="outside lower center", ncol=min(5, max(1, len(groups))), fontsize=8,
               frameon=False)
    return fig


def plot_bytes_per_step(runs: Runs, *, log: bool = True,
                        title: str = "Bytes per step by kind") -> Figure:
    """Horizontal grouped bars: the bytes each group of runs (the same run name over seeds:
    their mean) hands to collectives per step, by kind; a kind no run sends is left out, and
    each bar is labelled with its size."""
    df = bytes_long(runs)
    names = {n: r for n, r in load_runs(runs).items()}
    if not df.empty:
        corpora = {names[n].summary.corpus for n in df.run}
        df["group"] = [names[n].summary.name if len(corpora) == 1
                       else f"{names[n].summary.corpus}/{names[n].summary.name}" for n in df.run]
        df = df.groupby(["group", "kind"], sort=False, as_index=False).bytes_per_step.mean()
        sent = df.groupby("kind").bytes_per_step.sum()
        df = df[df.kind.isin(sent[sent > 0].index)]
    groups = list(dict.fromkeys(df.group)) if not df.empty else []
    words = registry.byte_kinds()          # each kind's name in words, in the wings' order
    kinds = [k for k in words if not df.empty and k in set(df.kind)]
    fig = Figure(figsize=(9, 0.32 * max(1, len(groups)) * max(1, len(kinds)) + 1.4),
                 layout="constrained")
    ax = fig.subplots()
    height = 0.8 / max(1, len(kinds))
    y = np.arange(len(groups))
    for i, kind in enumerate(kinds):
        values = df[df.kind == kind].set_index("group").bytes_per_step.reindex(groups).fillna(0)
        bars = ax.barh(y + (i - (len(kinds) - 1) / 2) * height, values.to_numpy(), height,
                       label=words[kind], color=f"C{i}")
        ax.bar_label(bars, labels=[_bytes_text(v) for v in values], padding=2, fontsize=7.5)
    ax.set_yticks(y, groups, fontsize=9)
    ax.grid(axis="y", visible=False)        # a line between the groups, not through the bars
    ax.invert_yaxis()
    if log and not df.empty and (df.bytes_per_step > 0).any():
        ax.set_xscale("log")
        low = df.bytes_per_step[df.bytes_per_step > 0].min()
        ax.set_xlim(low / 3, df.bytes_per_step.max() * 4)     # room for the labels
    ax.set_xlabel("bytes per step, per rank" + (" (log scale)" if log else ""))
    ax.set_title(title)
    if kinds:
        fig.legend(loc="outside right upper", fontsize=8, frameon=False, title="kind")
    return fig


def _bytes_text(value: float) -> str:
    """``3.5 MB``, ``62 kB``, ``0``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.3g} B" if value else "0"


def _byte_name(b: int) -> str:
    names = {9: "\\t", 10: "\\n", 13: "\\r", 32: "space"}
    if b in names:
        return names[b]
    return chr(b) if 33 <= b < 127 else f"0x{b:02x}"


def plot_byte_frequencies(splits: Mapping[str, np.ndarray], *, split: str = "train",
                          annotate: int = 6) -> Figure:
    """One panel per corpus (``splits``: name -> its bytes): the share of each byte value, as
    solid bars without edges (256 one-unit bars are thinner than the default white edge), the
    ``annotate`` most frequent bytes named above their bars."""
    n = max(1, len(splits))
    fig = Figure(figsize=(9, 2.8 * n + 0.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(n, 1, squeeze=False)).ravel()
    ticks = [0, 10, 32, 48, 65, 97, 127, 255]
    for ax, (name, data) in zip(axes, splits.items(), strict=False):
        counts = np.bincount(np.asarray(data, dtype=np.uint8), minlength=256)
        share = counts / max(1, counts.sum())
        ax.bar(np.arange(256), share, width=1.0, color="tab:blue", linewidth=0)
        for b in np.argsort(share)[::-1][:annotate]:
            if share[b] > 0:
                ax.annotate(_byte_name(int(b)), (b, share[b]), xytext=(0, 2),
                            textcoords="offset points", ha="center", fontsize=7.5)
        ax.set_xlim(-1, 256)
        ax.set_ylim(0, share.max() * 1.15 if share.max() > 0 else 1)
        ax.set_xticks(ticks, [f"{t}\n{_byte_name(t)}" if 9 < t < 127 else str(t)
                              for t in ticks], fontsize=8)
        ax.set(title=f"{name}: byte frequencies ({split})", xlabel="byte value",
               ylabel="share of bytes")
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
    line) and zero (grey); green rows are non-inferior, orange ones not; every mark and colour
    is in the legend below the axes. Diverged candidates are labelled."""
    n = max(1, len(comparisons))
    fig = Figure(figsize=(9, 0.45 * n + 1.4), layout="constrained")
    ax = fig.subplots()
    margins = sorted({c.margin for c in comparisons}) or [0.01]
    for m in margins:
        ax.axvline(m * 100, color="tab:red", linewidth=1.5)
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
    ax.set_xlabel("mean relative difference in eval loss (%)", fontsize=9)
    ax.set_title(title, fontsize=10)
    fig.legend(handles=forest_legend(margins), loc="outside lower center", ncol=3, fontsize=8,
               frameon=False)
    return fig


def forest_legend(margins: Sequence[float]) -> list[Any]:
    """Every mark of :func:`plot_forest`, its colours included."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="tab:green", marker="o", linewidth=2.5,
                   label="mean, non-inferior (U < margin)"),
            Line2D([], [], color="tab:orange", marker="o", linewidth=2.5,
                   label="mean, not non-inferior"),
            Line2D([], [], color="black", marker="|", markersize=12, markeredgewidth=2,
                   linestyle="", label="U: the verdict's upper bound"),
            Line2D([], [], color="0.3", marker="x", linestyle="", label="the other level's U"),
            *[Line2D([], [], color="tab:red", linewidth=1.5, label=f"margin {m:.1%}")
              for m in margins],
            Line2D([], [], color="0.6", linewidth=0.8, label="no difference")]


def save_figure(fig: Figure, path: str | Path) -> None:
    """PNG through a temporary file (atomic); fixed metadata so reruns give the same bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())
