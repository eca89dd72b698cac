"""The analysis of SCAPE's training-length study (:mod:`lmrepro.scape.study.scaling`).

Every quality figure here is judged on the **test** split (the lr sweep chose on the validation
split) with the seed as the unit (:func:`lmrepro.stats.noninferiority`: a one-sided t interval on
the per-seed mean relative differences, a sign-flip p-value). Per model size and training length:
the gap of each sparse method to dense AdamS and AdamW with its bounds, the dense baseline
against the corpus's trigram floor (a verdict is testable only 10 % below it), then the trend of
the gap over training length (least squares of the per-seed gaps on ``log10(steps)``, its slope
per decade with a t interval) and its extrapolation to the paper's 100 000 steps, labelled as an
extrapolation. The ablations are paired with the run they vary on the same seeds, and SCAPE's
mask diagnostics are averaged over the steps at the target sparsity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmrepro.io import atomic_write_text
from lmrepro.pipeline import length_study
from lmrepro.pipeline.length_study import (at_point, finish_window, mean_bpb, paired_test, pct,
                                           read_sweep, report_links, shown, trend)
from lmrepro.pipeline.runs import Run, load_run
from lmrepro.scape.study import mechanism
from lmrepro.scape.details import ScapeDetails
from lmrepro.stats import StatsConfig

STAGE = "scaling"
PAPER_STEPS = 100_000          # the SCAPE authors' runs (100 000 iterations)
SPARSE = ("scape", "topk")
DENSE = ("adams", "adamw")
DIAGNOSTICS = ("mask_kept", "step_enter", "step_stay", "reentry_gap", "residual_norm",
               "coverage_at_target")


RUN_COLUMNS = ["kind", "size", "steps", "seed", "run", "method", "sparsity", "lr", "val_bpb",
               "test_bpb", "diverged_at_step", "finished_at", "path"]


def _details(run: Run) -> dict[str, Any]:
    """SCAPE's columns of a run's row: method, sparsity, lr and test bits/byte."""
    d = ScapeDetails.of(run.summary)
    return {"method": run.summary.method, "sparsity": d.sparsity or 0.0, "lr": d.lr,
            "test_bpb": d.final_test_bpb}


def study_runs(stage_dir: str | Path) -> pd.DataFrame:
    """One row per finished run of the study (``runs/``) and its ablations (``ablations/``):
    kind, size, steps, seed, run name, method, sparsity, lr, final validation and test bits/byte,
    diverged step, when the run finished (its summary's time, UTC: the stage keeps finished runs
    whose identity matches, so a pipeline can publish runs trained before it), and the run
    directory; in the folders' order."""
    return length_study.study_runs(stage_dir, RUN_COLUMNS, _details, ("runs", "ablations"))


def gap_table(runs: pd.DataFrame, stats: StatsConfig, floor: Mapping[str, Any] | None
              ) -> pd.DataFrame:
    """Per size, length, dense baseline and sparse run (in the order the runs are found): the
    test-split gap with its seed-level bounds, the baseline's test bits/byte against the trigram
    floor and whether it is testable (:func:`lmrepro.pipeline.length_study.gap_table`)."""
    return length_study.gap_table(
        runs, stats, floor, DENSE,
        lambda by_run, base: [name for name, cand in by_run.items()
                              if cand[0].summary.method in SPARSE])


def ablation_table(runs: pd.DataFrame, stats: StatsConfig) -> pd.DataFrame:
    """Each ablation against the run it varies and against dense AdamS, on the same seeds at the
    verdict point (test split)."""
    abl = runs[runs.kind == "ablations"]
    rows = []
    for name, g in abl.groupby("run", sort=True):
        size, steps = g["size"].iloc[0], int(g["steps"].iloc[0])
        point = runs[(runs.kind == "runs") & (runs["size"] == size) & (runs.steps == steps)]
        cand = [load_run(p, p) for p in g.path]
        base_run = _ablated_run(cand[0])
        for base_name in (base_run, "adams"):
            base = [load_run(p, p) for p in point[point.run == base_name].path]
            if base:
                rows.append({"ablation": name, "against": base_name,
                             "test_bpb": mean_bpb(cand),
                             **paired_test(base, cand, stats)})
    return pd.DataFrame(rows)


def per_byte_table(runs: pd.DataFrame, stats: StatsConfig) -> pd.DataFrame:
    """Quality per byte: at each point, every sparse run against every sparse run that sends
    more bytes per step (test split, seed-level bounds), with both runs' bytes per step: does
    the cheaper method lose quality, or tie at fewer bytes?"""
    rows = []
    main = runs[(runs.kind == "runs") & runs.method.isin(SPARSE)]
    for (size, steps), point in main.groupby(["size", "steps"], sort=True):
        by_run = {name: [load_run(p, p) for p in g.path] for name, g in point.groupby("run")}
        sent = {name: float(np.mean([_bytes(r) for r in rs])) for name, rs in by_run.items()}
        for cand in sorted(by_run):
            for base in sorted(by_run):
                if sent[base] > sent[cand]:
                    rows.append({"size": size, "steps": int(steps), "candidate": cand,
                                 "baseline": base, "candidate_kb_per_step": sent[cand] / 1e3,
                                 "baseline_kb_per_step": sent[base] / 1e3,
                                 "candidate_test_bpb": mean_bpb(by_run[cand]),
                                 "baseline_test_bpb": mean_bpb(by_run[base]),
                                 **paired_test(by_run[base], by_run[cand], stats)})
    return pd.DataFrame(rows)


def _bytes(run: Run) -> float:
    """Bytes a worker sends per step after the first (the mask's bootstrap step)."""
    b = run.summary.bytes_per_step_after_step0 or run.summary.bytes_per_step or {}
    return float(b.get("total", 0.0))


def _ablated_run(run: Run) -> str:
    """The study run an ablation varies (its run config minus the ablation's name)."""
    cfg = run.summary.config.get("run", {})
    sparsity = round(float(cfg.get("sparsity", 0.0)) * 100)
    return f"{cfg.get('optimizer', 'scape')}{sparsity:g}"


def diagnostics_table(runs: pd.DataFrame, size: str, steps: int) -> pd.DataFrame:
    """SCAPE's mask diagnostics per run (means over seeds of the means over the steps at the
    target sparsity) at one point, ablations included."""
    sel = runs[(runs["size"] == size) & (runs.steps == steps) & (runs.method == "scape")]
    rows = []
    for name, g in sel.groupby("run", sort=True):
        per_seed = []
        for p in g.path:
            recs = [r for r in load_run(p, p).metrics if "mask_kept" in r]
            target = max((r["sparsity"] for r in recs), default=None)
            recs = [r for r in recs if r["sparsity"] == target]
            per_seed.append({k: float(np.mean([r[k] for r in recs if r.get(k) is not None]))
                             for k in DIAGNOSTICS if any(r.get(k) is not None for r in recs)})
        rows.append({"run": name, "seeds": len(per_seed),
                     **{k: float(np.mean([d[k] for d in per_seed if k in d]))
                        for k in DIAGNOSTICS if any(k in d for d in per_seed)}})
    return pd.DataFrame(rows)


def verdict_records(runs: pd.DataFrame, size: str, steps: int, stats: StatsConfig,
                    floors: Mapping[str, Mapping[str, Any]], leave_out: Sequence[str] = ()
                    ) -> Any:
    """The verdict point as :class:`~lmrepro.pipeline.records.AnalysisRecords` (stage
    ``scaling``), what the claims stage reads: the methods as the paper runs them, not the
    variants in ``leave_out`` (:func:`lmrepro.scape.study.mechanism.variants`)."""
    return length_study.verdict_records(runs, size, steps,
                                        lambda run: ~run.isin(list(leave_out)), STAGE, stats,
                                        floors)


def write_analysis(stage_dir: str | Path, out_dir: str | Path, stats: StatsConfig,
                   verdict: tuple[str, int], floors: Mapping[str, Mapping[str, Any]],
                   corpus: str, contrasts: Sequence[Any] = (), leave_out: Sequence[str] = ()
                   ) -> dict[str, Any]:
    """Every table of the study as CSV under ``out_dir``, ``analysis.json`` (the verdict point's
    records) and ``scaling.json`` (tables as records), the README section and the figures
    (:func:`lmrepro.pipeline.length_study.write_analysis`); returns the tables, records, figures
    and sweep."""
    from lmrepro.scape.study import horizon

    runs = study_runs(stage_dir)
    floor = floors.get(corpus)
    tables: dict[str, pd.DataFrame] = {"runs": runs.drop(columns=["path"])}
    gaps = gap_table(runs, stats, floor)
    tables["gaps"] = gaps
    tables["trend"] = trend(gaps, to_steps=PAPER_STEPS)
    tables["ablations"] = ablation_table(runs, stats)
    tables["diagnostics"] = diagnostics_table(runs, *verdict)
    tables["per_byte"] = per_byte_table(runs, stats)
    tables["contrasts"] = mechanism.contrast_table(runs, contrasts, *verdict, stats)
    tables["mechanism_diagnostics"] = mechanism.diagnostics_table(runs, *verdict)
    tables.update(horizon.multiplier_tables(runs, floor))
    branches = length_study.study_runs(stage_dir, RUN_COLUMNS, _details, ("branches",))
    tables["equal_final_multiplier"] = horizon.equal_final_table(branches)

    def analysis(t: Mapping[str, pd.DataFrame]) -> Any:
        if not len(at_point(runs, *verdict)):
            return None
        return with_multipliers(verdict_records(runs, *verdict, stats, floors, leave_out),
                                t["final_multiplier"], t["equal_final_multiplier"])

    return length_study.write_analysis(
        stage_dir, out_dir, STAGE, tables, verdict, floor, analysis=analysis,
        readme=lambda t, sweep: readme_markdown(t, sweep, verdict, floor),
        figures=lambda: _figures(runs, gaps, tables, floor, verdict, branches))


def _figures(runs: pd.DataFrame, gaps: pd.DataFrame, tables: Mapping[str, pd.DataFrame],
             floor: Mapping[str, Any] | None, verdict: tuple[str, int],
             branches: pd.DataFrame) -> dict[str, Any]:
    """The study's figures: the gaps and curves (:func:`lmrepro.scape.study.plots.figures`), the
    verdict point's stable-phase curves, the steps-to-target multipliers and, with decay
    branches, the final loss against training length and the multiplier at equal final loss."""
    from lmrepro.scape.study import horizon, plots

    figures = plots.figures(runs, gaps, floor, verdict)
    curves = horizon.point_curves(runs).get(verdict)
    if curves:
        figures["stable_curves"] = horizon.curves_figure(
            curves, floor, plots.COLOURS, f"Test loss along each run, {verdict[0]}, "
            f"{verdict[1]} steps (one line per seed)")
    if len(tables["multiplier"]):
        figures["multiplier"] = horizon.multiplier_figure(tables["multiplier"], floor,
                                                          plots.COLOURS)
    finals = horizon.final_curves(branches).get(verdict[0])
    if finals:
        equal = tables["equal_final_multiplier"]
        figures["final_loss_multiplier"] = horizon.final_curves_figure(
            finals, equal[equal["size"] == verdict[0]] if len(equal) else equal, plots.COLOURS,
            f"Final test loss against training length, {verdict[0]} (decay branches)")
    return figures


def with_multipliers(records: Any, ends: pd.DataFrame, equal: pd.DataFrame | None = None
                     ) -> Any:
    """The verdict point's records with each sparse run's steps-to-target multiplier for its
    final loss against dense AdamS on its comparison with AdamS: in a few words beside the gap
    (``steps_to_target``, the claims' measured text), in full among the caveats. The
    multiplier at equal final loss from decay branches (``equal``, its longest length:
    :func:`lmrepro.scape.study.horizon.equal_final_headline`) where the run has branches, else
    the constant-lr lower bound (``final_multiplier`` of
    :func:`lmrepro.scape.study.horizon.multiplier_tables`)."""
    from lmrepro.scape.study import horizon

    heads = horizon.equal_final_headline(equal) if equal is not None else pd.DataFrame()
    words = {r.candidate: (horizon.final_text(r), horizon.final_short(r))
             for r in ends.itertuples()} if len(ends) else {}
    words.update({r.candidate: (horizon.equal_final_text(r), horizon.equal_final_short(r))
                  for r in heads.itertuples()} if len(heads) else {})
    if not words:
        return records
    out = []
    for c in records.comparisons:
        name = c.candidate_runs[0].rsplit("/", 1)[-1] if c.candidate_runs else ""
        if name not in words or c.baseline_method != "adams":
            out.append(c)
            continue
        text, short = words[name]
        out.append(c.model_copy(update={"caveats": [*c.caveats, "steps to target: " + text],
                                        "steps_to_target": short}))
    return records.model_copy(update={"comparisons": out})


def stage_dir_sweep(stage_dir: str | Path) -> dict[str, Any] | None:
    """The study's lr sweep (``sweep/sweep.json``), or None without one."""
    return read_sweep(stage_dir)


def scaling_analysis_stage(params: Any, stage_dir: str | Path = "results/scaling",
                           out_dir: str | Path = "results/analysis/scaling"
                           ) -> dict[str, Any] | None:
    """The ``analysis_scaling`` stage (``params``: :class:`lmrepro.pipeline.params.Params`):
    :func:`write_analysis` of the profile's study, or None (and a note) without one
    (:func:`lmrepro.pipeline.length_study.analysis_stage`)."""
    from lmrepro.pipeline.analysis import corpus_floors

    def analyse(study: Any) -> dict[str, Any]:
        floors = corpus_floors(params.data.prepared_dir, {params.scape.corpus})
        return write_analysis(stage_dir, out_dir, params.stats,
                              (study.verdict_size, study.verdict_steps), floors,
                              params.scape.corpus, study.contrasts, mechanism.variants(study))

    result = length_study.analysis_stage(params.scape.scaling, out_dir, STAGE, analyse,
                                         _headline)
    if params.scape.workers is not None:
        floors = corpus_floors(params.data.prepared_dir, {params.scape.corpus})
        floor = floors.get(params.scape.corpus)
        workers_stage(Path(stage_dir) / "workers", Path(out_dir), params.stats,
                      None if floor is None else float(floor["trigram"]["test"]),
                      with_length_study=result is not None)
    return result


def workers_stage(stage_dir: Path, out_dir: Path, stats: StatsConfig, floor: float | None,
                  with_length_study: bool) -> dict[str, pd.DataFrame]:
    """The worker-count study's analysis (:mod:`lmrepro.scape.study.workers_report`) into
    ``out_dir/workers``; its section is the stage's README section, or follows the length
    study's."""
    from lmrepro.scape.study.workers_report import section_markdown, write_analysis

    tables = write_analysis(stage_dir, out_dir / "workers", stats, floor)
    text = section_markdown(tables, "results/analysis/scaling/workers/")
    readme = out_dir / length_study.README_SECTION
    if with_length_study and readme.exists():
        text = readme.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + text
    atomic_write_text(readme, text)
    return tables


def _headline(study: Any, result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The stage's headline items: the verdict point's gaps and mechanism contrasts, the
    contrasts read as the gaps are."""
    from lmrepro.pipeline.headline import study_items

    verdict = (study.verdict_size, study.verdict_steps)
    contrasts = result["tables"]["contrasts"]
    if len(contrasts):
        contrasts = contrasts.assign(size=verdict[0], steps=verdict[1],
                                     verdict=contrasts["direction"])
    return {**study_items(result["tables"]["gaps"], verdict), **study_items(contrasts, verdict)}


def _pct(x: Any) -> str:
    return pct(x, "")


def readme_markdown(tables: Mapping[str, pd.DataFrame], sweep: Mapping[str, Any] | None,
                    verdict: tuple[str, int], floor: Mapping[str, Any] | None) -> str:
    """The README's section on the study, from its tables only (links under
    :data:`lmrepro.pipeline.length_study.LINK_BASE`)."""
    from lmrepro.scape.study import horizon

    gaps, trend_t = tables["gaps"], tables["trend"]
    lines = [report_links("11_analysis_scaling", STAGE), ""]
    if floor is not None:
        lines += [f"n-gram floor of the corpus (test split): bigram "
                  f"{floor['bigram']['test']:.3f}, trigram {floor['trigram']['test']:.3f} "
                  f"bits/byte; a verdict is testable when the dense baseline ends 10 % below "
                  "the trigram floor.", ""]
    if sweep is not None:
        lines += [f"Learning rates (swept at {sweep['size']}, {sweep['steps']} steps, seed "
                  f"{sweep['seed']}, validation split): "
                  + ", ".join(f"{k} {v:g}" for k, v in sweep["best"].items())
                  + (f"; on the grid's edge: {', '.join(sweep['on_edge'])}"
                     if sweep["on_edge"] else "") + ".", ""]
    edge = tables.get("edge_check")
    if edge is not None and len(edge):
        lines += ["One grid step beyond each edge winner (same seed and length, validation "
                  "split; reported, not applied): " + "; ".join(
                      f"{r.run} at lr {r.beyond_lr:g}: "
                      + (f"{r.beyond_final_bpb:.3f} against {r.grid_bpb:.3f} at {r.grid_lr:g}"
                         if r.beyond_final_bpb is not None and math.isfinite(r.beyond_final_bpb)
                         else "diverged")
                      + (" (better: the optimum lies beyond the grid)" if r.beyond_is_better
                         else " (worse: the grid's winner stands)")
                      for r in edge.itertuples()) + ".", ""]
    runs = tables["runs"]
    if "finished_at" in runs and len(runs):
        lines += [f"The study's {len(runs)} runs (points and ablations) "
                  f"{finish_window(runs.finished_at)}; the stage keeps "
                  "a finished run whose settings, model and data are unchanged.", ""]
    lines += summary_sentences(tables, verdict)
    rows = ["| size | steps | candidate | vs | seeds | dense bits/byte (test) | mean gap | "
            "[L, U] | level | verdict | testable |",
            "|---|---:|---|---|---:|---:|---:|---|---|---|---|"]
    for r in gaps.itertuples():
        if r.baseline != "adams":
            continue
        rows.append(f"| {r.size} | {r.steps} | {r.candidate} | dense AdamS | {r.seeds} | "
                    f"{r.baseline_test_bpb:.3f} | {_pct(getattr(r, 'mean', None))} | "
                    f"[{_pct(getattr(r, 'lower', None))}, {_pct(getattr(r, 'upper', None))}] | "
                    f"{getattr(r, 'level', '')} | {getattr(r, 'verdict', '') or 'diverged'} | "
                    f"{'yes' if r.testable else 'no'} |")
    lines += rows + [""]
    if len(trend_t):
        lines += ["A straight line of the gap to dense AdamS in log10(steps), tested for lack "
                  "of fit against the seeds at each length; only a line that passes (p >= "
                  "0.05) would be extrapolated to the paper's 100 000 steps:", "",
                  "| size | candidate | slope per decade | lack of fit F | p | extrapolated |",
                  "|---|---|---|---:|---:|---|"]
        for r in trend_t[trend_t.baseline == "adams"].itertuples():
            ext = (f"{_pct(r.extrapolated_gap_at)} [{_pct(r.extrapolation_low)}, "
                   f"{_pct(r.extrapolation_high)}]" if r.extrapolated else "no (the line fails)")
            lines.append(f"| {r.size} | {r.candidate} | {_pct(r.slope_per_decade)} "
                         f"[{_pct(r.slope_low)}, {_pct(r.slope_high)}] | "
                         f"{r.lack_of_fit_F:.3g} | {r.lack_of_fit_p:.2g} | {ext} |")
        lines.append("")
    lines += horizon.equal_final_lines(tables.get("equal_final_multiplier"))
    lines += _multiplier_lines(tables.get("multiplier"))
    abl = tables.get("ablations")
    if abl is not None and len(abl):
        lines += [f"Ablations at {verdict[0]}, {verdict[1]} steps (test split):", "",
                  "| ablation | against | seeds | test bits/byte | mean | [L, U] | verdict |",
                  "|---|---|---:|---:|---:|---|---|"]
        for r in abl.itertuples():
            lines.append(f"| {r.ablation} | {r.against} | {r.seeds} | {r.test_bpb:.3f} | "
                         f"{_pct(getattr(r, 'mean', None))} | [{_pct(getattr(r, 'lower', None))}"
                         f", {_pct(getattr(r, 'upper', None))}] | {getattr(r, 'verdict', '')} |")
        lines.append("")
    return "\n".join(lines)


def _multiplier_lines(mult: pd.DataFrame | None) -> list[str]:
    """The README's steps-to-target table (none without curves)."""
    lines: list[str] = []
    if mult is not None and len(mult):
        lines += ["Steps to target (test split, 95 % t interval over seeds; a run's curve is "
                  "its stable phase under the wsd schedule): how many times dense AdamS's "
                  "steps each method needs to reach a loss. Each method holds its own tuned lr "
                  "constant here, so a method at a larger lr sits at a higher noise floor "
                  "until its decay: the sentences above place each final (decayed) loss on "
                  "AdamS's curve as well.", "",
                  "| size | candidate | target bits/byte | multiplier | [low, high] | seeds | "
                  "not reached |", "|---|---|---:|---:|---|---:|---:|"]
        for r in mult.itertuples():
            m, span = (f">= {r.multiplier:.2f}", "(a lower bound)") if r.censored else (
                f"{r.multiplier:.2f}", f"[{r.lower:.2f}, {r.upper:.2f}]")
            lines.append(f"| {r.size} | {r.candidate} | {r.target:.3f} | {m} | {span} | "
                         f"{r.seeds} | {r.censored} |")
        lines.append("")
    return lines


def summary_sentences(tables: Mapping[str, pd.DataFrame], verdict: tuple[str, int]
                      ) -> list[str]:
    """What the study says, in sentences computed from its tables: the gap to dense AdamS at
    the shortest and longest length of each size, and the mask diagnostics at the verdict
    point."""
    from lmrepro.scape.study import horizon

    gaps, out = tables["gaps"], []
    if len(gaps) and "mean" in gaps:
        for (size, cand), g in gaps[gaps.baseline == "adams"].groupby(["size", "candidate"]):
            g = g.dropna(subset=["mean"]).sort_values("steps")
            # every length, not two end points: each length's own schedule ends where it ends,
            # so a gap that is not monotone in length is not a trend
            out.append(f"{cand} against dense AdamS, model {size}: " + ", ".join(
                f"{_pct(r['mean'])} at {r.steps} steps" for _, r in g.iterrows()) + ".")
    trend_t = tables.get("trend")
    if trend_t is not None and len(trend_t) and "lack_of_fit_p" in trend_t:
        rejected = trend_t[trend_t.lack_of_fit_p < 0.05]
        if len(rejected):
            out.append(f"A straight line in log(steps) fails its lack-of-fit test for "
                       f"{len(rejected)} of {len(trend_t)} series (p < 0.05): the gaps are not a "
                       "trend, and none is extrapolated.")
    equal = tables.get("equal_final_multiplier")
    if equal is not None and len(equal):
        out += [horizon.equal_final_text(r) + "."
                for r in horizon.equal_final_headline(equal).itertuples()]
    out += horizon.describe(*(tables.get(k, pd.DataFrame()) for k in (
        "multiplier", "end_multiplier", "final_multiplier")))
    out += mechanism.describe(tables.get("contrasts", pd.DataFrame()))
    diag = tables.get("diagnostics")
    if diag is not None and len(diag) and "mask_kept" in diag:
        for r in diag.itertuples():
            if not math.isfinite(r.mask_kept):
                continue        # a run that never went sparse at this point
            out.append(f"{r.run} at {verdict[0]}, {verdict[1]} steps: {r.mask_kept:.0%} of the "
                       "mask kept from one step to the next.")
    return ["What it says (computed from the tables below):", "",
            *[f"* {x}" for x in out], ""] if out else []


#: what a report shows of each table of the study, and under which registered column name
#: (:mod:`lmrepro.scape.columns`: relative gaps as signed percentages); the CSVs keep all
DISPLAY: dict[str, dict[str, str]] = {
    "gaps": {"size": "size", "steps": "steps", "candidate": "candidate", "baseline": "baseline",
             "seeds": "seeds", "diverged": "diverged", "mean": "gap_mean", "lower": "gap_lower",
             "upper": "gap_upper", "level": "level", "batch_upper": "gap_batch_upper",
             "p_value": "p_noninferior", "p_worse": "p_worse", "verdict": "verdict",
             "baseline_test_bpb": "dense_test_bpb", "candidate_test_bpb": "candidate_test_bpb",
             "testable": "testable"},
    "multiplier": {"size": "size", "steps": "steps", "candidate": "candidate",
                   "target": "target_bpb", "multiplier": "multiplier",
                   "lower": "multiplier_lower", "upper": "multiplier_upper", "seeds": "seeds",
                   "censored": "not_reached", "baseline_steps": "dense_steps",
                   "candidate_steps": "candidate_steps"},
    "per_byte": {"size": "size", "steps": "steps", "candidate": "candidate",
                 "baseline": "baseline", "candidate_kb_per_step": "candidate_kb_per_step",
                 "baseline_kb_per_step": "baseline_kb_per_step", "seeds": "seeds",
                 "candidate_test_bpb": "candidate_test_bpb",
                 "baseline_test_bpb": "baseline_test_bpb", "mean": "gap_mean",
                 "lower": "gap_lower", "upper": "gap_upper", "verdict": "verdict"},
    "final_multiplier": {"size": "size", "steps": "steps", "candidate": "candidate",
                         "candidate_final_test_bpb": "candidate_test_bpb",
                         "baseline_steps": "dense_steps", "multiplier": "multiplier",
                         "lower": "multiplier_lower", "upper": "multiplier_upper",
                         "seeds": "seeds", "unreached": "not_reached"},
    "end_multiplier": {"size": "size", "steps": "steps", "candidate": "candidate",
                       "candidate_steps": "candidate_steps", "multiplier": "multiplier",
                       "lower": "multiplier_lower", "upper": "multiplier_upper",
                       "seeds": "seeds", "censored": "not_reached"},
    "trend": {"size": "size", "candidate": "candidate", "baseline": "baseline",
              "points": "points", "slope_per_decade": "slope_per_decade",
              "slope_low": "slope_low", "slope_high": "slope_high", "p_slope": "p_slope",
              "lack_of_fit_F": "lack_of_fit_F", "lack_of_fit_p": "lack_of_fit_p",
              "extrapolated": "extrapolated",
              "extrapolated_gap_at": "extrapolated_gap",
              "extrapolation_low": "extrapolation_low",
              "extrapolation_high": "extrapolation_high"},
    "ablations": {"ablation": "ablation", "against": "against", "seeds": "seeds",
                  "diverged": "diverged", "test_bpb": "candidate_test_bpb", "mean": "gap_mean",
                  "lower": "gap_lower", "upper": "gap_upper", "p_value": "p_noninferior",
                  "p_worse": "p_worse", "verdict": "verdict"},
    # step_enter (the 0.447 identity) and step_stay stay in the CSV, not in the report
    "diagnostics": {"run": "run", "seeds": "seeds", "mask_kept": "mask_kept",
                    "reentry_gap": "reentry_gap", "residual_norm": "residual_norm",
                    "coverage_at_target": "coverage_at_target"},
}


def for_display(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The columns of table ``name`` a report shows (:data:`DISPLAY` and the mechanism
    tables'), renamed to their registered display names."""
    return shown({**DISPLAY, **mechanism.DISPLAY}, name, frame)

