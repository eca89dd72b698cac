"""SCAPE-specific tables and figures: the mask-rule ablation (``ef_momentum`` against
``stale_m``: coverage, residual norm, final bits per byte), coverage and residual norm over steps,
and the learning-rate sweep. Everything is computed from run directories (``summary.json`` and
``metrics.jsonl``, :mod:`lmrepro.results`) and the sweep table (:mod:`lmrepro.scape.train.sweep`);
runs are grouped by what their summaries say (method, sparsity), never by directory name, and
several seeds of one configuration are pooled (mean and spread).

``python -m lmrepro.scape.analysis.report [--results results] [--doc docs/scape.md]`` writes the
tables and figures to ``results/analysis/scape/`` and regenerates the measured section of
``docs/scape.md`` (between its ``<!-- scape-report:begin -->`` / ``end`` markers).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lmrepro.io import atomic_write_text, read_json, read_jsonl
from lmrepro.results import METRICS, read_summary
from lmrepro.rundirs import collect_runs
from lmrepro.scape.details import ScapeDetails

SPARSE_METHODS = ("scape", "scape_stale_m", "topk", "topk_adamw")
COMMON_LR = 2e-3     # the common lr the sweep's findings compare against (AdamW's)
BEGIN, END = "<!-- scape-report:begin -->", "<!-- scape-report:end -->"
LABELS = {"adamw": "dense AdamW", "adams": "dense AdamS", "scape": "SCAPE (ef_momentum)",
          "scape_stale_m": "SCAPE-stale_m", "topk": "top-k + EF on AdamS",
          "topk_adamw": "top-k + EF on AdamW"}


def load(runs: Mapping[str, str | Path]) -> list[dict[str, Any]]:
    """Every run's summary (dict) and its per-step training records."""
    out = []
    for name, path in runs.items():
        path = Path(path)
        s = read_summary(path).to_json()
        steps = [r for r in read_jsonl(path / METRICS) if "step_time_s" in r]
        out.append({"key": name, "summary": s, "steps": steps})
    return out


def _config(s: dict[str, Any]) -> str:
    label = LABELS.get(s["method"], s["method"])
    if s["method"] in SPARSE_METHODS:
        label += f" {100 * (ScapeDetails.of(s).sparsity or 0):g} %"
    return label


def _mean_sd(xs: Sequence[float]) -> str:
    if not xs:
        return ""
    if len(xs) == 1:
        return f"{xs[0]:.4g}"
    return f"{statistics.fmean(xs):.4g} ± {statistics.stdev(xs):.2g}"


def method_table(loaded: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per configuration (method, sparsity), seeds pooled: the learning rate, final bits
    per byte (mean ± sd over seeds; diverged runs counted apart), and for the sparse methods the
    mean sparsity reached, the final coverage and the largest residual norm."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in loaded:
        s = r["summary"]
        groups.setdefault((s["method"], ScapeDetails.of(s).sparsity or 0.0), []).append(r)
    rows = []
    order = list(LABELS)
    for (method, sparsity), rs in sorted(groups.items(),
                                         key=lambda kv: (order.index(kv[0][0])
                                                         if kv[0][0] in order else 99,
                                                         kv[0][1])):
        ss = [r["summary"] for r in rs]
        ok = [s["final_bpb"] for s in ss if s["final_bpb"] is not None]
        d = [ScapeDetails.of(s) for s in ss]
        rows.append({
            "configuration": _config(ss[0]), "method": method, "sparsity": sparsity,
            "seeds": len(ss),
            "lr": ", ".join(sorted({f"{x.lr if x.lr is not None else float('nan'):g}" for x in d})),
            "final bits/byte": _mean_sd(ok),
            "diverged": sum(s["diverged_at_step"] is not None for s in ss),
            "mean sparsity reached": _mean_sd([x.mean_sparsity for x in d
                                               if x.mean_sparsity is not None]),
            "final coverage": _mean_sd([x.final_coverage for x in d
                                        if x.final_coverage is not None]),
            "coverage at target sparsity": _mean_sd(
                [x.final_coverage_at_target for x in d
                 if x.final_coverage_at_target is not None]),
            "max residual norm": _mean_sd([x.max_residual_norm for x in d
                                           if x.max_residual_norm is not None]),
        })
    return pd.DataFrame(rows)


def ablation_table(loaded: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The mask-rule ablation: SCAPE's ``ef_momentum`` and ``stale_m`` runs (and the dense AdamS
    reference), as :func:`method_table` rows."""
    table = method_table(loaded)
    return table[table["method"].isin(["adams", "scape", "scape_stale_m"])].reset_index(
        drop=True)


def curves(loaded: Sequence[dict[str, Any]], key: str) -> pd.DataFrame:
    """``step``, ``run``, ``configuration``, ``seed`` and ``key`` of the sparse runs' steps."""
    rows = [{"step": st["step"], "run": r["key"], "configuration": _config(r["summary"]),
             "seed": r["summary"]["seed"], key: st[key]}
            for r in loaded if r["summary"]["method"] in SPARSE_METHODS
            for st in r["steps"] if key in st]
    return pd.DataFrame(rows, columns=["step", "run", "configuration", "seed", key])


def curve_figure(loaded: Sequence[dict[str, Any]], key: str, ylabel: str, title: str,
                 log: bool = False) -> Any:
    """A line per configuration (mean over seeds, band = their range) of ``key`` over steps."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    df = curves(loaded, key)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if not df.empty:
        sns.lineplot(data=df, x="step", y=key, hue="configuration", errorbar=("pi", 100),
                     ax=ax)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    if log:
        ax.set_yscale("log")
    fig.tight_layout()
    plt.close(fig)
    return fig


def sweep_frame(table: Mapping[str, Any]) -> pd.DataFrame:
    """The sweep as a grid: one row per learning rate, one column per run; each cell the final
    bits per byte, ``diverged`` or empty; the winner of each column marked with ``*``."""
    rows = table.get("rows") or []
    if not rows:
        return pd.DataFrame()
    lrs = sorted({r["lr"] for r in rows})
    runs = list(dict.fromkeys(r["run"] for r in rows))
    cell = {(r["lr"], r["run"]): r for r in rows}
    out = []
    for lr in lrs:
        row: dict[str, Any] = {"lr": f"{lr:g}"}
        for run in runs:
            r = cell.get((lr, run))
            if r is None:
                row[run] = ""
            elif r["final_bpb"] is None:
                row[run] = f"diverged@{r['diverged_at_step']}"
            else:
                row[run] = f"{r['final_bpb']:.4f}" + (" *" if r.get("best") else "")
        out.append(row)
    return pd.DataFrame(out)


def lr_findings(table: Mapping[str, Any], common_lr: float) -> pd.DataFrame:
    """What the sweep says about the learning-rate question: per run, its best lr and bits per
    byte there, its bits per byte at one common lr (the grid value nearest ``common_lr``), how
    much worse that is, and the run's rank among the runs at the common lr and at each one's
    best (1 = lowest bits per byte; a diverged run ranks last)."""
    rows = table.get("rows") or []
    if not rows:
        return pd.DataFrame()
    lrs = sorted({r["lr"] for r in rows})
    common = min(lrs, key=lambda x: abs(math.log(x / common_lr)))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    at = {(r["run"], r["lr"]): r["final_bpb"] for r in rows}
    best = table.get("best") or {}
    inf = float("inf")

    def val(x: float | None) -> float:
        return inf if x is None else x

    at_common = {run: val(at.get((run, common))) for run in runs}
    at_best = {run: val(at.get((run, best[run]))) if run in best else inf for run in runs}
    rank_common = {run: i + 1 for i, run in enumerate(sorted(runs, key=at_common.get))}
    rank_best = {run: i + 1 for i, run in enumerate(sorted(runs, key=at_best.get))}
    out = []
    for run in runs:
        b, c = at_best[run], at_common[run]
        out.append({"run": run, "best lr": f"{best[run]:g}" if run in best else "all diverged",
                    "bits/byte at best lr": "" if b == inf else f"{b:.4f}",
                    f"bits/byte at lr {common:g}": "diverged" if c == inf else f"{c:.4f}",
                    "worse at the common lr": ("" if inf in (b, c) else
                                               f"{100 * (c - b) / b:+.1f} %"),
                    "rank at the common lr": rank_common[run],
                    "rank at its best lr": rank_best[run]})
    return pd.DataFrame(out)


def sweep_figure(table: Mapping[str, Any]) -> Any:
    """Final bits per byte against the learning rate (log scale), a line per run; diverged
    values are left out (marked on the axis as x). Without a sweep, a line of text saying so."""
    import matplotlib.pyplot as plt

    rows = table.get("rows") or []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in dict.fromkeys(r["run"] for r in rows):
        pts = sorted((r["lr"], r["final_bpb"]) for r in rows if r["run"] == run)
        ok = [(lr, b) for lr, b in pts if b is not None]
        line = ax.plot([p[0] for p in ok], [p[1] for p in ok], marker="o", label=run)
        bad = [lr for lr, b in pts if b is None]
        if bad and ok:
            ax.plot(bad, [max(b for _, b in ok)] * len(bad), "x", color=line[0].get_color())
    if not rows:    # a figure says so in words rather than drawing empty axes
        ax.set_axis_off()
        ax.text(0.5, 0.5, "No learning-rate sweep in this profile: each run at its own lr\n"
                "from params.yaml (the reference profile's sweep winners)", ha="center",
                va="center", fontsize=12, transform=ax.transAxes)
        fig.set_size_inches(8, 1.2)
        plt.close(fig)
        return fig
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final bits per byte (val)",
           title="Learning-rate sweep (x: diverged)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def _markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no runs)"
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def scape_report(results_root: str | Path = "results",
                 out_dir: str | Path | None = "results/analysis/scape",
                 common_lr: float = COMMON_LR) -> dict[str, Any]:
    """Tables and figures of the SCAPE stage's runs and sweep; written to ``out_dir`` (CSV and
    PNG) unless it is None. ``common_lr``: the one lr :func:`lr_findings` compares against.
    Returns ``tables``, ``figures``, ``sweep`` and ``runs``."""
    stage = Path(results_root) / "scape"
    runs = collect_runs(stage / "runs")
    loaded = load(runs)
    sweep_path = stage / "sweep" / "sweep.json"
    sweep = read_json(sweep_path) if sweep_path.exists() else {"rows": [], "sweep": None}
    tables = {"methods": method_table(loaded), "ablation": ablation_table(loaded),
              "sweep": sweep_frame(sweep), "lr_findings": lr_findings(sweep, common_lr)}
    figures = {
        "coverage": curve_figure(loaded, "coverage", "fraction ever selected",
                                 "Coverage: coordinates selected at least once while sparse"),
        "coverage_at_target": curve_figure(
            loaded, "coverage_at_target", "fraction ever selected",
            "Coverage counted from the end of the sparsity warm-up (target sparsity)"),
        "residual_norm": curve_figure(loaded, "residual_norm", "L2 norm (gradient units)",
                                      "Error-feedback residual (rank 0)", log=True),
        "sparsity": curve_figure(loaded, "sparsity", "fraction not sent",
                                 "Sparsity reached per step (1-D tensors, sent whole, "
                                 "count as sent)"),
        "sweep": sweep_figure(sweep)}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            atomic_write_text(out / f"scape_{name}.csv", df.to_csv(index=False))
        for name, fig in figures.items():
            fig.savefig(out / f"scape_{name}.png", dpi=110)
    return {"tables": tables, "figures": figures, "sweep": sweep, "runs": runs}


def doc_section(report: Mapping[str, Any], results_root: str | Path, note: str = "",
                made: str = "") -> str:
    """The generated part of docs/scape.md: where the figures come from (``made``: when the
    runs were published), the comparison of every configuration, the ablation, and the sweep
    grid with its winners."""
    sweep = report["sweep"]
    runs = report["runs"]
    first = next(iter(runs.values()), None)
    shape = ""
    if first is not None:
        s = read_summary(first)
        m, st = s.config.get("model", {}), s.config.get("settings", {})
        shape = (f"model {m.get('n_layers')}x{m.get('d_model')} (context {m.get('context')}), "
                 f"{s.processes} gloo workers x batch {st.get('batch_size')}, {s.steps} steps, "
                 f"corpus {s.corpus}")
    seeds = sorted({r["summary"]["seed"] for r in load(runs)}) if runs else []
    parts = [BEGIN, "",
             f"Generated by `lmrepro publish --pages-only` from `{results_root}/scape/`"
             + (f" ({made})" if made else "") + f": {shape}; seeds {seeds}. {note}".rstrip(),
             "", "**Every configuration** (seeds pooled: mean ± sd; lr = the run's peak "
             "learning rate):", "", _markdown(report["tables"]["methods"]), "",
             "**The mask-rule ablation** (SCAPE with the authors' rule against our first "
             "reading, beside dense AdamS; coverage = fraction of the top-k tensors' "
             "coordinates selected at least once while sparse, and counted only from the end "
             "of the sparsity warm-up, when the sparsity is the target; residual norm in "
             "gradient units, rank 0, the largest over the run):", "",
             _markdown(report["tables"]["ablation"]), ""]
    if sweep.get("rows"):
        sw = sweep["sweep"] or {}
        parts += [f"**Learning-rate sweep** ({sw.get('steps')} steps, seed {sw.get('seed')}; "
                  "final validation bits per byte; `*` = the run's best, used by the suite; "
                  f"winners on the grid's edge: {sweep.get('on_edge') or 'none'}):", "",
                  _markdown(report["tables"]["sweep"]), "",
                  "**The learning-rate question** (from the sweep: each run at one common lr, "
                  "the section's default, against each at its own best):", "",
                  _markdown(report["tables"]["lr_findings"]), ""]
    analysis = Path(results_root) / "analysis" / "scape" / "analysis.json"
    if analysis.exists():
        comps = read_json(analysis)["comparisons"]
        rows = pd.DataFrame([{
            "comparison": c["label"], "pairs": c["n_pairs"],
            "mean relative difference": ("" if c["mean_rel_diff"] is None
                                         else f"{100 * c['mean_rel_diff']:+.2f} %"),
            "one-sided upper bound": ("" if c["upper_bound"] is None
                                      else f"{100 * c['upper_bound']:+.2f} %"),
            "margin": f"{100 * c['margin']:.0f} %", "verdict": c["verdict"]} for c in comps])
        parts += ["**Non-inferiority** (the pipeline's paired bootstrap, "
                  "`lmrepro.pipeline.analysis`, on the same runs: eval batches of every seed "
                  "pooled):", "", _markdown(rows), ""]
    parts.append(END)
    return "\n".join(parts)


def doc_sections(root: str | Path) -> list[tuple[Path, str, str, str]]:
    """The measured section of docs/scape.md from ``root``'s published reference run:
    ``(doc, begin, end, section)`` (``lmrepro publish --pages-only`` writes it; the tables and
    figures go to a scratch folder, the publication is only read)."""
    import tempfile

    published = Path(root) / "published" / "reference"
    prov = read_json(published / "reports" / "provenance.json")
    git = prov.get("git") or {}
    when = str(prov.get("generated_at", ""))[:10]
    note = (f"The published reference run (`published/reference/`, profile `reference`, commit "
            f"{str(git.get('commit'))[:7]}, {when}; "
            + ("a commit with local changes" if git.get("dirty") else "a clean commit")
            + ", the profile selected with LMREPRO_PROFILE).")
    with tempfile.TemporaryDirectory() as out:
        report = scape_report(published / "results", out)
        text = doc_section(report, "published/reference/results", note, f"published {when}")
    return [(Path(root) / "docs" / "scape.md", BEGIN, END, text)]
