"""What every training-length study shares (SCAPE's and RGC's): the finished runs below a
directory, the seed-level paired test of one run against another, and the trend of a gap over
training length.

The seed is the unit (:func:`lmrepro.stats.noninferiority`, docs/statistics.md): the bound is a
one-sided t interval on the per-seed mean relative differences with a sign-flip p-value beside
it; the trend is least squares of the per-seed gaps on ``log10(steps)`` with a t interval on its
slope, and an extrapolation, where one is asked for, is labelled as such by its column names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from lmrepro.io import read_json
from lmrepro.pipeline.runs import Run
from lmrepro.rundirs import collect_runs, split_run_label
from lmrepro.stats import StatsConfig, noninferiority

LOG2 = math.log(2)


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
