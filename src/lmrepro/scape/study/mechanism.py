"""What explains SCAPE's gap to dense AdamS: the study's contrasts (``scape.scaling.contrasts``,
the ``mechanism`` profile), each a pair of verdict-point runs that differ in one thing, read as
the sentences a reader needs: what the change does to quality, how much of the baseline's gap to
dense AdamS it closes, and what it rules in or out; and the diagnostics that describe where each
method's steps land (the share of coordinates in the mask at least once per 100 steps, the share
of the step's size that falls off the mask).

A contrast's gap is the candidate's test loss relative to the baseline's, paired by seed (one
t bound per side over the seeds, :func:`lmrepro.pipeline.length_study.paired_test`). "Closes x %
of the gap" compares the two runs' own gaps to dense AdamS at the same seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lmrepro.pipeline.length_study import paired_test
from lmrepro.pipeline.runs import load_run
from lmrepro.stats import StatsConfig

#: what a report shows of the tables (column -> registered name, :mod:`lmrepro.scape.columns`)
DISPLAY: dict[str, dict[str, str]] = {
    "contrasts": {"candidate": "candidate", "baseline": "baseline", "isolates": "isolates",
                  "seeds": "seeds", "mean": "gap_mean", "lower": "gap_lower",
                  "upper": "gap_upper", "direction": "direction",
                  "candidate_gap_to_adams": "candidate_gap_to_adams",
                  "baseline_gap_to_adams": "baseline_gap_to_adams", "gap_closed": "gap_closed"},
    "mechanism_diagnostics": {"run": "run", "seeds": "seeds",
                              "recent_coverage": "recent_coverage",
                              "off_mask_mass": "off_mask_mass"},
}

#: the per-step diagnostics of the sparse optimizers that carry information
DIAGNOSTICS = ("recent_coverage", "off_mask_mass")
DENSE_REFERENCE = "adams"


def variants(study: Any) -> list[str]:
    """The study's runs that set a mechanism knob (the momentum off the mask, their own dense
    steps): ablations of their method, which no claim about the method may speak for."""
    return sorted({r.run_name for runs in study.runs.values() for r in runs
                   if r.off_mask_momentum is not None or r.dense_steps is not None})


def contrast_table(runs: pd.DataFrame, contrasts: Sequence[Any], size: str, steps: int,
                   stats: StatsConfig) -> pd.DataFrame:
    """One row per contrast at the point ``(size, steps)``: the candidate against its baseline
    (test split, paired by seed), both runs' mean gaps to dense AdamS on the same seeds and
    the share of the baseline's gap the candidate closes."""
    point = runs[(runs.kind == "runs") & (runs["size"] == size) & (runs.steps == steps)]
    by_run = {name: [load_run(p, p) for p in g.path] for name, g in point.groupby("run")}
    dense = by_run.get(DENSE_REFERENCE, [])
    rows = []
    for c in contrasts:
        cand, base = by_run.get(c.candidate, []), by_run.get(c.baseline, [])
        if not cand or not base:
            continue
        row: dict[str, Any] = {"candidate": c.candidate, "baseline": c.baseline,
                               "isolates": c.isolates, **paired_test(base, cand, stats)}
        if dense and c.baseline != DENSE_REFERENCE:
            t_cand, t_base = paired_test(dense, cand, stats), paired_test(dense, base, stats)
            g_cand, g_base = t_cand.get("mean"), t_base.get("mean")
            row["candidate_gap_to_adams"], row["baseline_gap_to_adams"] = g_cand, g_base
            # a share of the gap only where the baseline's gap is one (its lower bound > 0)
            row["gap_closed"] = (None if g_cand is None or not t_base.get("lower", 0) > 0
                                 else (g_base - g_cand) / g_base)
        row["direction"] = direction(row)
        rows.append(row)
    keep = ["candidate", "baseline", "isolates", "seeds", "diverged", "mean", "lower", "upper",
            "direction", "candidate_gap_to_adams", "baseline_gap_to_adams", "gap_closed"]
    frame = pd.DataFrame(rows)
    return frame[[k for k in keep if k in frame]] if len(frame) else frame


def direction(row: Mapping[str, Any]) -> str:
    """``better``/``worse`` when both one-sided bounds lie on one side of 0, else ``no
    difference detected`` (``diverged`` when a candidate seed diverged)."""
    if row.get("diverged"):
        return "diverged"
    lo, up = row.get("lower"), row.get("upper")
    if lo is None or up is None or not (math.isfinite(lo) and math.isfinite(up)):
        return "untested"
    if up < 0:
        return "better"
    if lo > 0:
        return "worse"
    return "no difference detected"


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{100 * float(x):+.2f} %"


def sentence(row: Mapping[str, Any]) -> str:
    """What one contrast says, in words that claim no more than its bounds."""
    d = direction(row)
    head = (f"{row['candidate']} against {row['baseline']} ({row['isolates'] or 'one change'}):"
            f" {_pct(row.get('mean'))} [L {_pct(row.get('lower'))}, U {_pct(row.get('upper'))}],"
            f" {row.get('seeds', 0)} seeds")
    closed = row.get("gap_closed")
    has_closed = closed is not None and math.isfinite(float(closed))
    if d == "better":
        tail = "better" + (f": it closes {100 * closed:.0f} % of {row['baseline']}'s gap to "
                           "dense AdamS" if has_closed else "")
    elif d == "worse":
        tail = "worse" + (f": it widens {row['baseline']}'s gap to dense AdamS by "
                          f"{-100 * closed:.0f} %" if has_closed else "")
    elif d == "no difference detected":
        bound = max(abs(float(row["lower"])), abs(float(row["upper"])))
        tail = (f"no difference detected: an effect larger than {100 * bound:.1f} % either way "
                "is ruled out at these seeds, a smaller one is not")
    else:
        tail = d
    return f"{head}: {tail}."


def describe(contrasts: pd.DataFrame) -> list[str]:
    """A sentence per contrast (:func:`sentence`)."""
    if contrasts is None or not len(contrasts):
        return []
    return [sentence(r) for r in contrasts.to_dict("records")]


def diagnostics_table(runs: pd.DataFrame, size: str, steps: int,
                      start_fraction: float = 0.5) -> pd.DataFrame:
    """Per sparse run at the point: the means (over the second half of each run, then over
    seeds) of the share of the top-k tensors' coordinates in the mask at least once in the
    last 100 steps, and of the share of the step's size ``sum |u|`` off the mask."""
    sel = runs[(runs.kind == "runs") & (runs["size"] == size) & (runs.steps == steps)
               & runs.method.isin(("scape", "topk"))]
    rows = []
    for name, g in sel.groupby("run", sort=True):
        per_seed: dict[str, list[float]] = {k: [] for k in DIAGNOSTICS}
        for p in g.path:
            recs = [r for r in load_run(p, p).metrics if DIAGNOSTICS[0] in r]
            recs = [r for r in recs if r.get("step", 0) >= start_fraction * steps]
            for k in DIAGNOSTICS:
                vals = [float(r[k]) for r in recs if r.get(k) is not None]
                if vals:
                    per_seed[k].append(float(np.mean(vals)))
        if any(per_seed.values()):
            rows.append({"run": name, "seeds": len(g),
                         **{k: float(np.mean(v)) if v else None for k, v in per_seed.items()}})
    return pd.DataFrame(rows)
