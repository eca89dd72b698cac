"""What every training-length study's analysis shares (SCAPE's and RGC's): the finished runs
below a directory and their table (:func:`study_runs`), the seed-level paired test of one run
against another, the gap table of each point's candidates against its baselines
(:func:`gap_table`), the trend of a gap over training length, the verdict point's records
(:func:`verdict_records`) and the writing of the study's tables, records, README section and
figures (:func:`write_analysis`). Each wing supplies what is its own: its columns and how they
are read from a run, its baselines and candidates, its stage name, its extra tables, its README
wording and its figures.

The seed is the unit (:func:`lmrepro.stats.noninferiority`, docs/statistics.md): the bound is a
one-sided t interval on the per-seed mean relative differences with a sign-flip p-value beside
it; the trend is least squares of the per-seed gaps on ``log10(steps)`` with a t interval on its
slope, and an extrapolation, where one is asked for, is labelled as such by its column names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from lmrepro.io import atomic_write_json, atomic_write_text, read_json
from lmrepro.pipeline.analysis import analysis_records
from lmrepro.pipeline.comparisons import run_comparisons
from lmrepro.pipeline.runs import Run, load_run
from lmrepro.pipeline.study_section import EDGE_JSON, SWEEP, SWEEP_JSON
from lmrepro.rundirs import collect_runs, run_label, split_run_label
from lmrepro.stats import StatsConfig, noninferiority

LOG2 = math.log(2)
#: the README section a study's analysis writes beside its tables
README_SECTION = "readme_section.md"
#: where the published folder goes in the section's links (replaced by ``lmrepro publish``)
LINK_BASE = "{published}"


@dataclass(frozen=True)
class StudyRun:
    """A finished run of a study, by where it lies: ``<size>/L<steps>/seed<N>/<run>``."""

    label: str
    size: str
    steps: int
    seed: int
    run: str
    path: Path


def find_runs(root: Path) -> list[StudyRun]:
    """The finished runs below a study's folder of runs (``runs``, ``sweep``, ``ablations``),
    sorted by label (:func:`lmrepro.rundirs.collect_runs`,
    :func:`~lmrepro.rundirs.split_run_label`)."""
    found = []
    for label, path in collect_runs(root).items():
        point, seed, run = split_run_label(label)
        size, length = point.split("/")[-2:]
        found.append(StudyRun(label, size, int(length.removeprefix("L")), seed, run, path))
    return found


def study_runs(stage_dir: str | Path, columns: Sequence[str],
               details: Callable[[Run], Mapping[str, Any]], kinds: Sequence[str] = ("runs",),
               order: Sequence[str] = ()) -> pd.DataFrame:
    """One row per finished run below ``<stage_dir>/<kind>`` for each of ``kinds``: the kind,
    size, steps, seed and run name, the final validation bits/byte, the diverged step, when the
    run finished (:func:`finished_at`) and the run directory, with the wing's own columns as
    ``details`` reads them from the run (its test bits/byte among them), as ``columns``; in the
    folders' order, or sorted (stably) by ``order`` where it is given."""
    rows = []
    for kind in kinds:
        for found in find_runs(Path(stage_dir) / kind):
            run = load_run(found.label, found.path)
            s = run.summary
            rows.append({"kind": kind, "size": found.size, "steps": found.steps,
                         "seed": found.seed, "run": found.run, **details(run),
                         "val_bpb": s.final_bpb, "diverged_at_step": s.diverged_at_step,
                         "finished_at": finished_at(run), "path": str(found.path)})
    frame = pd.DataFrame(rows, columns=list(columns))
    if order:
        return frame.sort_values(list(order), kind="stable", ignore_index=True)
    return frame


def at_point(runs: pd.DataFrame, size: str, steps: int) -> pd.DataFrame:
    """The study's own runs (kind ``runs``) at one point."""
    return runs[(runs.kind == "runs") & (runs["size"] == size) & (runs.steps == steps)]


def finished_at(run: Run) -> str | None:
    """When the run finished (UTC, to the minute): its summary's ``finished_at``; None for runs
    written before summaries carried it (a file's time would say when it was copied, not
    trained)."""
    return f"{run.summary.finished_at[:16]}Z" if run.summary.finished_at else None


def finish_window(times: pd.Series) -> str:
    """``finished between <first> and <last> (UTC)`` over the runs' recorded times
    (:func:`finished_at`), with how many were trained before runs recorded it."""
    known = times.dropna()
    unknown = len(times) - len(known)
    if not len(known):
        return "were trained before runs recorded their finish time"
    return (f"finished between {known.min()} and {known.max()} (UTC"
            + (f"; {unknown} trained before runs recorded their finish time" if unknown else "")
            + ")")


def losses(run: Run) -> list[float]:
    return list(run.test_losses or run.eval_losses)


def paired_test(base: Sequence[Run], cand: Sequence[Run], stats: StatsConfig
                ) -> dict[str, Any]:
    """The seed-level test of ``cand`` against ``base`` (paired by seed, then test batch)."""
    by_seed = {r.summary.seed: r for r in base}
    pairs = [(by_seed[c.summary.seed], c) for c in cand if c.summary.seed in by_seed]
    if not pairs or any(c.summary.diverged_at_step is not None for _, c in pairs):
        n_div = sum(c.summary.diverged_at_step is not None for _, c in pairs)
        return {"seeds": len(pairs), "diverged": n_div}
    b = [x for p in pairs for x in losses(p[0])]
    c = [x for p in pairs for x in losses(p[1])]
    groups = [p[1].summary.seed for p in pairs for _ in losses(p[1])]
    r = noninferiority(b, c, margin=stats.margin, confidence=stats.confidence,
                       n_resamples=stats.n_resamples, seed=stats.seed, groups=groups,
                       min_groups=2)   # the seed is the unit: its t bound from 2 seeds on
    return {"seeds": len(pairs), "diverged": 0, "mean": r.mean_rel_diff,
            "lower": r.lower_bound, "upper": r.upper_bound, "level": r.level,
            "seed_lower": r.seed_lower_bound, "seed_upper": r.seed_upper_bound,
            "batch_upper": r.batch_upper_bound, "p_value": r.p_value,
            "p_worse": r.p_value_worse, "verdict": r.verdict,
            "per_seed": list(r.group_means), "per_seed_ids": sorted({p[1].summary.seed
                                                                     for p in pairs})}


def mean_bpb(runs: Sequence[Run]) -> float:
    """The mean over runs of each run's mean test loss, in bits/byte."""
    return float(np.mean([np.mean(losses(r)) / LOG2 for r in runs]))


#: a wing's candidates at a point: ``(runs by name, baseline name) -> candidate names``, in the
#: order of the table's rows
Candidates = Callable[[Mapping[str, list[Run]], str], Iterable[str]]


def gap_table(runs: pd.DataFrame, stats: StatsConfig, floor: Mapping[str, Any] | None,
              baselines: Sequence[str], candidates: Candidates) -> pd.DataFrame:
    """Per size and length of the study's own runs, each of ``baselines`` that ran there and
    each of its ``candidates``: the test-split gap (:func:`paired_test`), both runs' test
    bits/byte, the corpus's trigram floor and whether the baseline is testable against it."""
    from lmrepro.data.ngram import testable

    rows = []
    main = runs[runs.kind == "runs"]
    tri = None if floor is None else float(floor["trigram"]["test"])
    for (size, steps), point in main.groupby(["size", "steps"], sort=True):
        by_run: dict[str, list[Run]] = {}
        for rec in point.itertuples():
            by_run.setdefault(rec.run, []).append(load_run(rec.path, rec.path))
        for base_name in baselines:
            base = by_run.get(base_name)
            if not base:
                continue
            bpb = mean_bpb(base)
            for name in candidates(by_run, base_name):
                cand = by_run[name]
                rows.append({"size": size, "steps": int(steps), "candidate": name,
                             "baseline": base_name, **paired_test(base, cand, stats),
                             "baseline_test_bpb": bpb, "candidate_test_bpb": mean_bpb(cand),
                             "trigram_floor": tri,
                             "testable": True if tri is None else testable(bpb, tri)})
    return pd.DataFrame(rows)


def verdict_records(runs: pd.DataFrame, size: str, steps: int, keep: Callable[[pd.Series],
                    pd.Series], stage: str, stats: StatsConfig,
                    floors: Mapping[str, Mapping[str, Any]]) -> Any:
    """The verdict point's runs whose names ``keep`` selects (a boolean mask of the run
    column) as :class:`~lmrepro.pipeline.records.AnalysisRecords` of ``stage``, what the claims
    read."""
    point = at_point(runs, size, steps)
    point = point[keep(point.run)]
    named = {run_label(f"{size}/L{steps}", r.seed, r.run): r.path for r in point.itertuples()}
    outcomes = run_comparisons(named, stats=stats, floors=floors)
    return analysis_records(named, stage=stage, stats=stats, outcomes=outcomes, floors=floors)


def lack_of_fit(x: np.ndarray, y: np.ndarray, fitted: np.ndarray, params: int = 2
                ) -> tuple[float, float]:
    """The lack-of-fit F test of a fitted line against the replicates (seeds) at each x: the
    residual sum of squares split into pure error (replicates about their own mean, df = n - k)
    and lack of fit (the rest, df = k - ``params``); ``(F, p)``, NaN without replicates or with
    k <= ``params`` distinct x. A small p says the line does not describe the means."""
    levels = np.unique(x)
    pure = float(sum(((y[x == v] - y[x == v].mean()) ** 2).sum() for v in levels))
    df_pe, df_lof = len(x) - len(levels), len(levels) - params
    if df_pe <= 0 or df_lof <= 0 or pure <= 0:
        return math.nan, math.nan
    lof = float(((y - fitted) ** 2).sum()) - pure
    f = (lof / df_lof) / (pure / df_pe)
    return f, float(sps.f.sf(f, df_lof, df_pe))


def trend(gaps: pd.DataFrame, confidence: float = 0.95, to_steps: int | None = None,
          alpha: float = 0.05) -> pd.DataFrame:
    """Per size, candidate and baseline with >= 3 lengths: least squares of the per-seed gaps on
    ``log10(steps)``: the slope per decade with its two-sided ``confidence`` t interval and the
    lack-of-fit F test (:func:`lack_of_fit`), and, with ``to_steps``, the gap extrapolated there
    with its prediction interval (``extrapolated_gap_at``, ``extrapolation_low``/``_high``)
    only where the line passes that test (p >= ``alpha``): a rejected line is not
    extrapolated (``extrapolated`` False says so)."""
    rows: list[dict[str, Any]] = []
    if gaps.empty:
        return pd.DataFrame(rows)
    for (size, cand, base), g in gaps.groupby(["size", "candidate", "baseline"], sort=True):
        xs, ys = [], []
        for rec in g.itertuples():
            if isinstance(rec.per_seed, list):
                xs += [math.log10(rec.steps)] * len(rec.per_seed)
                ys += list(rec.per_seed)
        if len(set(xs)) < 3 or len(xs) < 4:
            continue
        x, y = np.asarray(xs), np.asarray(ys)
        fit = sps.linregress(x, y)
        n, df = len(x), len(x) - 2
        q = sps.t.ppf(0.5 + confidence / 2, df)
        resid = y - (fit.intercept + fit.slope * x)
        s = math.sqrt(float(resid @ resid) / df)
        lof_f, lof_p = lack_of_fit(x, y, fit.intercept + fit.slope * x)
        row = {"size": size, "candidate": cand, "baseline": base, "points": n,
               "lengths": sorted({int(round(10 ** v)) for v in xs}),
               "slope_per_decade": fit.slope, "slope_low": fit.slope - q * fit.stderr,
               "slope_high": fit.slope + q * fit.stderr, "p_slope": fit.pvalue,
               "lack_of_fit_F": lof_f, "lack_of_fit_p": lof_p,
               "extrapolated": bool(to_steps is not None and math.isfinite(lof_p)
                                    and lof_p >= alpha)}
        if row["extrapolated"] and to_steps is not None:
            x0 = math.log10(to_steps)
            se_pred = s * math.sqrt(1 + 1 / n + (x0 - x.mean()) ** 2
                                    / float(((x - x.mean()) ** 2).sum()))
            at = fit.intercept + fit.slope * x0
            row |= {"extrapolated_to_steps": to_steps, "extrapolated_gap_at": at,
                    "extrapolation_low": at - q * se_pred, "extrapolation_high": at + q * se_pred}
        rows.append(row)
    return pd.DataFrame(rows)


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in row.items()} for row in frame.to_dict(orient="records")]


def shown(display: Mapping[str, Mapping[str, str]], name: str, frame: pd.DataFrame
          ) -> pd.DataFrame:
    """The columns of table ``name`` a report shows (``display[name]``: column -> registered
    display name), renamed."""
    cols = {k: v for k, v in display[name].items() if k in frame.columns}
    return frame[list(cols)].rename(columns=cols)


def read_if_there(path: Path) -> Any:
    """A study's JSON file (its sweep, its edge check), or None where it was not written."""
    return read_json(path) if path.exists() else None


def read_sweep(stage_dir: str | Path) -> dict[str, Any] | None:
    """The study's lr sweep (``sweep/sweep.json``, written by
    :mod:`lmrepro.pipeline.study_engine`), or None without one."""
    return read_if_there(Path(stage_dir) / SWEEP / SWEEP_JSON)


def write_analysis(stage_dir: str | Path, out_dir: str | Path, stage: str,
                   tables: dict[str, pd.DataFrame], verdict: tuple[str, int],
                   floor: Mapping[str, Any] | None, *,
                   analysis: Callable[[Mapping[str, pd.DataFrame]], Any],
                   readme: Callable[[Mapping[str, pd.DataFrame], Mapping[str, Any] | None], str],
                   figures: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A study's analysis under ``out_dir``: the wing's ``tables`` and, from ``stage_dir``, the
    sweep's rows (``sweep``) and the edge check's (``edge_check``) each as CSV; the verdict
    point's records (``analysis`` of the tables, None without them) as ``analysis.json``;
    ``<stage>.json`` (the verdict point, the floor, the sweep and every table as records); the
    README section (``readme`` of the tables and the sweep) and the ``figures`` as PNG. Returns
    the tables, records, figures and sweep."""
    from lmrepro.pipeline.plots import save_figure

    out_dir = Path(out_dir)
    sweep = read_sweep(stage_dir)
    if sweep is not None:
        tables["sweep"] = pd.DataFrame(sweep["rows"])
    edge = read_if_there(Path(stage_dir) / SWEEP / EDGE_JSON)
    if edge is not None:
        tables["edge_check"] = pd.DataFrame(edge["rows"])
    for name, frame in tables.items():
        atomic_write_text(out_dir / f"{name}.csv", frame.to_csv(index=False))
    rec = analysis(tables)
    if rec is not None:      # the claims stage reads the verdict point, when it has runs
        atomic_write_json(out_dir / "analysis.json", rec.model_dump(mode="json"))
    atomic_write_json(out_dir / f"{stage}.json", {
        "verdict": {"size": verdict[0], "steps": verdict[1]}, "floor": floor, "sweep": sweep,
        **{k: records(v) for k, v in tables.items()}})
    atomic_write_text(out_dir / README_SECTION, readme(tables, sweep))
    figs = figures()
    for name, fig in figs.items():
        save_figure(fig, out_dir / f"{name}.png")
    return {"tables": tables, "records": rec, "figures": figs, "sweep": sweep}


def analysis_stage(section: Any, out_dir: str | Path, stage: str,
                   analyse: Callable[[Any], dict[str, Any]],
                   headline: Callable[[Any, dict[str, Any]], Mapping[str, Mapping[str, Any]]]
                   ) -> dict[str, Any] | None:
    """A study's analysis stage: ``analyse`` of the profile's study ``section`` (the wing's
    :func:`write_analysis`) and the stage's headline metrics, ``headline`` of the section and the
    result (:mod:`lmrepro.pipeline.headline`); without a study (``section`` None), a note in
    ``<stage>.json``, an empty headline and None."""
    from lmrepro.pipeline.headline import metrics_dir, write_headline

    folder = metrics_dir(out_dir, stage)
    if section is None:
        atomic_write_json(Path(out_dir) / f"{stage}.json",
                          {"note": "no training-length study in this profile"})
        write_headline(folder, {})
        return None
    result = analyse(section)
    write_headline(folder, headline(section, result))
    return result


def report_links(page: str, stage: str) -> str:
    """A README section's first line: the study's full report (``reports/<page>.html``) and
    its tables (``results/analysis/<stage>/``), under :data:`LINK_BASE`."""
    return (f"Full report: [{LINK_BASE}/reports/{page}.html]({LINK_BASE}/reports/{page}.html); "
            f"tables in [{LINK_BASE}/results/analysis/{stage}/]"
            f"({LINK_BASE}/results/analysis/{stage}/).")


def pct(x: Any, missing: str) -> str:
    """A relative figure as a signed percentage (``+1.23 %``), ``missing`` where there is none
    (None or not finite)."""
    return missing if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{100 * float(x):+.2f} %"
