"""The analysis of RGC's training-length study (:mod:`lmrepro.rgc.study.scaling`).

Every quality figure is judged on the **test** split (the lr sweep chose on the validation
split) with the seed as the unit (:func:`lmrepro.pipeline.length_study.paired_test`: a one-sided
t interval on the per-seed mean relative differences, a sign-flip p-value). Per model size and
training length: the gap of each RGC run to global backprop with its bounds, backprop's test
bits/byte against the corpus's trigram floor (a verdict is testable only 10 % below it), then
the trend of the gap over training length (least squares of the per-seed gaps on
``log10(steps)``, the slope per decade with a t interval). The paper states no training length
for its enwik8 runs, so the trend is not extrapolated to it. At the verdict point, the
**frontier** (:func:`frontier_table`): each RGC run's gap against its horizon H and consensus
staleness s, beside the throughput the RGC benchmark measured for that (H, s) (async over
backprop, ``bench/results/rgc.json``): the speed-quality trade the paper is about.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmrepro.pipeline import length_plots, length_study
from lmrepro.pipeline.length_study import at_point, finish_window, pct, report_links, shown, trend
from lmrepro.pipeline.runs import Run
from lmrepro.results import run_settings
from lmrepro.rgc.details import RGCDetails
from lmrepro.stats import StatsConfig

STAGE = "rgc_scaling"
RUN_COLUMNS = ["kind", "size", "steps", "run", "seed", "executor", "horizon",
               "consensus_staleness", "lr", "val_bpb", "test_bpb", "diverged_at_step",
               "finished_at", "path"]
COLOURS = {"rgc": "tab:blue", "rgc_stale1": "tab:orange", "backprop": "black"}


def _details(run: Run) -> dict[str, Any]:
    """RGC's columns of a run's row: executor, horizon, staleness, lr and test bits/byte."""
    d = RGCDetails.of(run.summary)
    return {"executor": d.executor, "horizon": d.horizon,
            "consensus_staleness": d.consensus_staleness,
            "lr": run_settings(run.summary.config).get("lr"), "test_bpb": d.final_test_bpb}


def study_runs(stage_dir: str | Path) -> pd.DataFrame:
    """One row per finished run of the study (``runs/<size>/L<steps>/seed<N>/<run>``), by size,
    length, run and seed: the order a reader scans, whatever the folders' order on disk."""
    return length_study.study_runs(stage_dir, RUN_COLUMNS, _details,
                                   order=["size", "steps", "run", "seed"])


def gap_table(runs: pd.DataFrame, stats: StatsConfig, floor: Mapping[str, Any] | None,
              baseline: str) -> pd.DataFrame:
    """Per size, length and RGC run (by name): the test-split gap to ``baseline`` with its
    seed-level bounds, the baseline's test bits/byte against the trigram floor and whether it
    is testable (:func:`lmrepro.pipeline.length_study.gap_table`)."""
    return length_study.gap_table(
        runs, stats, floor, [baseline],
        lambda by_run, base: sorted(name for name in by_run if name != base))


def verdict_records(runs: pd.DataFrame, size: str, steps: int, candidate: str, baseline: str,
                    stats: StatsConfig, floors: Mapping[str, Mapping[str, Any]]) -> Any:
    """The verdict point's ``candidate`` and ``baseline`` runs as
    :class:`~lmrepro.pipeline.records.AnalysisRecords` (stage ``rgc_scaling``), what the claims
    read."""
    return length_study.verdict_records(runs, size, steps,
                                        lambda run: run.isin([candidate, baseline]), STAGE,
                                        stats, floors)


FRONTIER_COLUMNS = ["size", "steps", "candidate", "horizon", "consensus_staleness", "seeds",
                    "mean", "lower", "upper", "verdict", "testable", "benchmark_run",
                    "tokens_per_s_vs_backprop", "benchmark_shape"]


def _benchmark_rows(bench: Mapping[str, Any] | None) -> dict[tuple[int, int], tuple[str, float]]:
    """``(H, s) -> (run name, async tokens/s over backprop's at the same cores)`` of the RGC
    benchmark's async runs."""
    if bench is None:
        return {}
    return {(int(r["horizon"]), int(r["consensus_staleness"])): (name,
                                                                float(r["vs_backprop_same_cores"]))
            for name, r in bench.get("rows", {}).items()}


def frontier_table(runs: pd.DataFrame, gaps: pd.DataFrame, verdict: tuple[str, int],
                   bench: Mapping[str, Any] | None) -> pd.DataFrame:
    """At the verdict point, per RGC run: its horizon H and staleness s, its gap to the baseline
    (mean and one-sided bounds, verdict, testable), and beside it the RGC benchmark's async
    throughput over backprop's at the same (H, s) (None where the benchmark has no such run).
    The benchmark's model is its own (``benchmark_shape``), not the study's."""
    point = gaps[(gaps["size"] == verdict[0]) & (gaps.steps == verdict[1])] if len(gaps) else gaps
    measured = _benchmark_rows(bench)
    shape = ""
    if bench is not None:
        m = bench["config"]["model"]
        shape = (f"{m['n_layers']}x{m['d_model']}, placement {bench['placement']}, "
                 f"{bench['threads']} threads")
    rows = []
    for g in point.itertuples():
        mine = runs[(runs["size"] == verdict[0]) & (runs.steps == verdict[1])
                    & (runs.run == g.candidate)]
        if not len(mine):
            continue
        h, s = int(mine.horizon.iloc[0]), int(mine.consensus_staleness.iloc[0])
        name, ratio = measured.get((h, s), (None, None))
        rows.append({"size": g.size, "steps": int(g.steps), "candidate": g.candidate,
                     "horizon": h, "consensus_staleness": s, "seeds": g.seeds,
                     "mean": getattr(g, "mean", None), "lower": getattr(g, "lower", None),
                     "upper": getattr(g, "upper", None), "verdict": getattr(g, "verdict", None),
                     "testable": g.testable, "benchmark_run": name,
                     "tokens_per_s_vs_backprop": ratio, "benchmark_shape": shape})
    return pd.DataFrame(rows, columns=FRONTIER_COLUMNS).sort_values(
        ["consensus_staleness", "horizon"], ignore_index=True)


def shows_frontier(frontier: pd.DataFrame | None) -> bool:
    """Whether a frontier has anything to show: RGC runs at more than one horizon (a profile
    whose runs share one horizon shows none)."""
    return frontier is not None and frontier.horizon.nunique() > 1


def frontier_figure(frontier: pd.DataFrame, baseline: str) -> Any:
    """The gap against H, one line per staleness s, the one-sided bounds as bars and each
    point's benchmark throughput (x backprop) written beside it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for s, part in frontier.groupby("consensus_staleness"):
        part = part.sort_values("horizon")
        mean = 100 * part["mean"].astype(float)
        err = [mean - 100 * part["lower"].astype(float), 100 * part["upper"].astype(float) - mean]
        # s = 0 dodged left with its labels on the left, s >= 1 to the right: at equal H the
        # two lines' points and labels would otherwise overlap
        side = -1 if s == 0 else 1
        x = part.horizon + 0.04 * side
        ax.errorbar(x, mean, yerr=err, marker="o", capsize=3,
                    label=f"consensus staleness s = {s}")
        for xi, r in zip(x, part.itertuples()):
            if r.tokens_per_s_vs_backprop is not None and np.isfinite(r.tokens_per_s_vs_backprop):
                ax.annotate(f"{r.tokens_per_s_vs_backprop:.2f}x", (xi, 100 * float(r.mean)),
                            textcoords="offset points", xytext=(8 * side, 0), fontsize=8,
                            ha="right" if side < 0 else "left", va="center")
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(1, color="grey", lw=0.8, ls="--", label="1 % margin")
    ax.set_xlabel("horizon H (stages a local loss reaches back)")
    ax.set_ylabel(f"test loss gap to {baseline} (%)")
    ax.set_xticks(sorted(frontier.horizon.unique()))
    ax.margins(x=0.25)   # room for the labels beside the outermost points
    ax.set_title("RGC at the verdict point: gap against H and s\n(labels: benchmark tokens/s "
                 f"x {baseline}, its own model)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figures(runs: pd.DataFrame, gaps: pd.DataFrame, floor: Mapping[str, Any] | None,
            verdict: tuple[str, int], baseline: str, frontier: pd.DataFrame | None = None
            ) -> dict[str, Any]:
    out = {"gap_vs_length": length_plots.gap_vs_length(gaps, baseline, COLOURS, baseline)}
    if len(at_point(runs, *verdict)):
        out["verdict_curves"] = length_plots.verdict_curves(runs, *verdict, floor, COLOURS)
    if shows_frontier(frontier):
        out["frontier"] = frontier_figure(frontier, baseline)
    return out


def write_analysis(stage_dir: str | Path, out_dir: str | Path, stats: StatsConfig,
                   study: Any, floors: Mapping[str, Mapping[str, Any]], corpus: str
                   ) -> dict[str, Any]:
    """Every table as CSV under ``out_dir``, ``analysis.json`` (the verdict point's lockstep RGC
    against the baseline), ``rgc_scaling.json`` (tables as records), the README section and the
    figures (:func:`lmrepro.pipeline.length_study.write_analysis`); returns the tables,
    records, figures and sweep."""
    from lmrepro.rgc.analysis import speedup

    runs = study_runs(stage_dir)
    floor = floors.get(corpus)
    verdict = (study.verdict_size, study.verdict_steps)
    gaps = gap_table(runs, stats, floor, study.baseline)
    frontier = frontier_table(runs, gaps, verdict, speedup.load("rgc"))
    tables = {"runs": runs.drop(columns=["path"]), "gaps": gaps, "trend": trend(gaps),
              "frontier": frontier}
    # the claim's RGC: lockstep at the section's horizon (the first such run)
    lockstep = next((r.name for r in study.runs if r.executor != "backprop"
                     and r.consensus_staleness == 0 and r.horizon in (None, 1)),
                    next((r.name for r in study.runs if r.executor != "backprop"
                          and r.consensus_staleness == 0), None))

    def analysis(_: Mapping[str, pd.DataFrame]) -> Any:
        if lockstep is None or not len(at_point(runs, *verdict)):
            return None
        return verdict_records(runs, *verdict, lockstep, study.baseline, stats, floors)

    return length_study.write_analysis(
        stage_dir, out_dir, STAGE, tables, verdict, floor, analysis=analysis,
        readme=lambda t, sweep: readme_markdown(t, sweep, verdict, study.baseline),
        figures=lambda: figures(runs, gaps, floor, verdict, study.baseline, frontier))


def analysis_stage(params: Any, stage_dir: str | Path = "results/rgc_scaling",
                   out_dir: str | Path = "results/analysis/rgc_scaling") -> dict[str, Any] | None:
    """The ``analysis_rgc_scaling`` stage: :func:`write_analysis` of the profile's study, or
    None (and a note) without one (:func:`lmrepro.pipeline.length_study.analysis_stage`)."""
    from lmrepro.pipeline.analysis import corpus_floors
    from lmrepro.pipeline.headline import study_items

    def analyse(study: Any) -> dict[str, Any]:
        corpus = params.rgc.corpora[0]
        floors = corpus_floors(params.data.prepared_dir, {corpus})
        return write_analysis(stage_dir, out_dir, params.stats, study, floors, corpus)

    return length_study.analysis_stage(
        params.rgc.scaling, out_dir, STAGE, analyse,
        lambda study, result: study_items(result["tables"]["gaps"],
                                          (study.verdict_size, study.verdict_steps)))


#: the columns a report shows of each table, by their registered names
DISPLAY: dict[str, dict[str, str]] = {
    "gaps": {"size": "size", "steps": "steps", "candidate": "run", "seeds": "seeds",
             "diverged": "diverged", "baseline_test_bpb": "backprop_test_bpb",
             "candidate_test_bpb": "rgc_test_bpb", "mean": "gap_mean", "lower": "gap_lower",
             "upper": "gap_upper", "level": "level", "p_value": "p_noninferior",
             "p_worse": "p_worse", "verdict": "verdict", "testable": "testable"},
    "frontier": {"horizon": "horizon", "consensus_staleness": "consensus_staleness",
                 "candidate": "run", "seeds": "seeds", "mean": "gap_mean", "lower": "gap_lower",
                 "upper": "gap_upper", "verdict": "verdict", "testable": "testable",
                 "tokens_per_s_vs_backprop": "tokens_per_s_vs_backprop",
                 "benchmark_run": "benchmark_run"},
    "trend": {"size": "size", "candidate": "run", "points": "points",
              "slope_per_decade": "slope_per_decade", "slope_low": "slope_low",
              "slope_high": "slope_high", "p_slope": "p_slope"},
}


def for_display(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The columns of table ``name`` a report shows (:data:`DISPLAY`), renamed to their
    registered names."""
    return shown(DISPLAY, name, frame)


def _pct(x: Any) -> str:
    return pct(x, "n/a")


def readme_markdown(tables: Mapping[str, pd.DataFrame], sweep: Mapping[str, Any] | None,
                    verdict: tuple[str, int], baseline: str) -> str:
    """The README's section on the study: the gaps per point, the trend, the sweep."""
    runs, gaps, tr = tables["runs"], tables["gaps"], tables["trend"]
    lines = [report_links("13_analysis_rgc_scaling", STAGE), "",
             f"RGC against {baseline} on the test split, the seed as the unit (one-sided 95 % "
             "t bounds on the per-seed mean relative differences; margin 1 %). Verdict point: "
             f"{verdict[0]} at {verdict[1]} steps.", ""]
    if len(runs):
        lines += [f"The study's {len(runs)} runs {finish_window(runs.finished_at)}.", ""]
    if len(gaps):
        lines += ["| size | steps | run | seeds | backprop test bits/byte | run test bits/byte | "
                  "mean gap | [L, U] | verdict | testable |", "|---" * 10 + "|"]
        for r in gaps.itertuples():
            lines.append(f"| {r.size} | {r.steps} | {r.candidate} | {r.seeds} | "
                         f"{r.baseline_test_bpb:.3f} | {r.candidate_test_bpb:.3f} | "
                         f"{_pct(getattr(r, 'mean', None))} | [{_pct(getattr(r, 'lower', None))}"
                         f", {_pct(getattr(r, 'upper', None))}] | "
                         f"{getattr(r, 'verdict', '') or 'diverged'} | "
                         f"{'yes' if r.testable else 'no'} |")
        lines.append("")
    front = tables.get("frontier")
    if front is not None and shows_frontier(front):
        lines += [f"The frontier at the verdict point: each RGC run's gap against its horizon H "
                  "and consensus staleness s, beside the RGC benchmark's async tokens/s over "
                  f"{baseline}'s at the same (H, s) and cores (`bench/results/rgc.json`, its "
                  f"own model: {front.benchmark_shape.iloc[0] or 'not run'}):", "",
                  "| H | s | run | seeds | mean gap | [L, U] | verdict | tokens/s x backprop |",
                  "|---" * 8 + "|"]
        for r in front.itertuples():
            tput = ("not measured" if r.tokens_per_s_vs_backprop is None
                    or not np.isfinite(r.tokens_per_s_vs_backprop)
                    else f"{r.tokens_per_s_vs_backprop:.3f} ({r.benchmark_run})")
            lines.append(f"| {r.horizon} | {r.consensus_staleness} | {r.candidate} | {r.seeds} "
                         f"| {_pct(r.mean)} | [{_pct(r.lower)}, {_pct(r.upper)}] | "
                         f"{r.verdict or 'diverged'} | {tput} |")
        lines.append("")
    if len(tr):
        lines += ["Trend of the gap per decade of training steps (least squares on the per-seed "
                  "gaps, 95 % interval; not extrapolated: the paper gives no training length):",
                  "", "| size | run | slope per decade | p |", "|---|---|---|---|"]
        for r in tr.itertuples():
            lines.append(f"| {r.size} | {r.candidate} | {_pct(r.slope_per_decade)} "
                         f"[{_pct(r.slope_low)}, {_pct(r.slope_high)}] | {r.p_slope:.3g} |")
        lines.append("")
    if sweep is not None:
        edge = ", ".join(sweep["on_edge"]) or "none"
        lines += [f"Learning rates swept at {sweep['size']}, {sweep['steps']} steps (seed "
                  f"{sweep['seed']}, validation split): winners "
                  + ", ".join(f"{k} {v:g}" for k, v in sorted(sweep["best"].items()))
                  + f"; on the grid's edge: {edge}.", ""]
    checked = tables.get("edge_check")
    if checked is not None and len(checked):
        lines += ["One grid step beyond each edge winner (same seed and length, validation "
                  "bits/byte): " + "; ".join(
                      f"{r.run} {r.grid_lr:g} -> {r.grid_bpb:.3f}, {r.beyond_lr:g} -> "
                      f"{r.beyond_final_bpb:.3f} ({'better' if r.beyond_is_better else 'worse'})"
                      for r in checked.itertuples())
                  + ". The study keeps the grid's winners.", ""]
    return "\n".join(lines)
