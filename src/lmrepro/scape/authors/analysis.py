"""What the SCAPE authors' own logs measured: step times per run and density phase,
the per-step speedup over dense AdamS of the same model and world size, SCAPE against dense lm
loss at matched iterations, and where the logs stop. Pure functions of the table of
:mod:`lmrepro.scape.authors.logs` (one row per logged iteration).

Spread: a step time is the median over the steady steps of a phase with its interquartile
range (IQR); a ratio of two medians is given with the range the two IQRs allow
(``q1_a / q3_b`` to ``q3_a / q1_b``), a loss difference with the t interval of the mean of the
per-iteration differences.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

#: steps after a (re)start that carry set-up time (the logs: 3.7 s and 2.5 s before 1.3 s)
SKIP_AFTER_START = 2
#: a SCAPE step sends the target density within this relative tolerance (after a resume the
#: reducer logs 0.100089 for the target 0.1: the 1-D tensors it always sends)
TARGET_TOLERANCE = 0.01
PHASES = ("dense", "dense phase", "warm-up", "target")


def label_phases(df: pd.DataFrame) -> pd.DataFrame:
    """``phase``: ``dense`` (a dense optimizer), or SCAPE's ``dense phase`` (everything sent),
    ``warm-up`` (between) and ``target`` (the target density)."""
    out = df.copy()
    scape = out.method == "scape"
    at_target = (out.density / out.target_density - 1).abs() <= TARGET_TOLERANCE
    out["phase"] = np.select([~scape, out.density >= 1 - 1e-9, at_target],
                             ["dense", "dense phase", "target"], "warm-up")
    return out


def steady(df: pd.DataFrame, skip: int = SKIP_AFTER_START) -> pd.DataFrame:
    """Rows with a step time, less the first ``skip`` steps after a logged (re)start."""
    start = df.start_iteration
    warm = start.notna() & (df.iteration <= start + skip)
    return df[df.elapsed_ms.notna() & ~warm]


def add_blocks(df: pd.DataFrame) -> pd.DataFrame:
    """``block``: ``first-last`` of the run of consecutive iterations a row belongs to (one
    excerpt page, or pages read back to back)."""
    out = df.sort_values(["path", "segment", "iteration"]).copy()
    new = (out.iteration.diff() != 1) | (out.path != out.path.shift()) \
        | (out.segment != out.segment.shift())
    ident = new.cumsum()
    first = out.groupby(ident).iteration.transform("min")
    last = out.groupby(ident).iteration.transform("max")
    out["block"] = first.astype(int).astype(str) + "-" + last.astype(int).astype(str)
    return out


def summary(seconds: pd.Series) -> dict[str, float]:
    """``n``, ``median_s``, ``q1_s``, ``q3_s`` of step times in seconds."""
    s = seconds.dropna()
    if s.empty:
        return {"n": 0, "median_s": math.nan, "q1_s": math.nan, "q3_s": math.nan}
    return {"n": int(s.size), "median_s": float(s.median()), "q1_s": float(s.quantile(0.25)),
            "q3_s": float(s.quantile(0.75))}


def _steady_phases(df: pd.DataFrame) -> pd.DataFrame:
    out = add_blocks(label_phases(steady(df)))
    warm = out.phase == "warm-up"
    band = out.groupby("block").density.transform("median").map(lambda d: f"{d:.2f}")
    out["band"] = np.where(warm, band, "")
    return out


def step_times(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, world size, method, run, phase (and, in the warm-up, each excerpt's density
    band): the median step with its IQR, the density and the iterations read."""
    keys = ["model", "world_size", "method", "run", "phase", "band"]
    rows = []
    for key, g in _steady_phases(df).groupby(keys, sort=False):
        rows.append({**dict(zip(keys, key)), **summary(g.elapsed_ms / 1e3),
                     "density": float(g.density.median()),
                     "iterations": f"{int(g.iteration.min())}-{int(g.iteration.max())}"})
    order = {p: i for i, p in enumerate(PHASES)}
    out = pd.DataFrame(rows)
    return out.sort_values(["model", "world_size", "method", "run", "phase"],
                           key=lambda c: c.map(order) if c.name == "phase" else c,
                           kind="stable").reset_index(drop=True)


def ratio(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """``a / b`` of two step-time summaries: the ratio of medians and the range the IQRs
    allow."""
    return {"ratio": a["median_s"] / b["median_s"], "low": a["q1_s"] / b["q3_s"],
            "high": a["q3_s"] / b["q1_s"]}


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per SCAPE run, phase and band: dense step / SCAPE step against dense AdamS of the same
    model and world size (every steady dense step pooled), and against the run's own dense
    phase where its log has one."""
    st = _steady_phases(df)
    dense = st[st.method != "scape"]
    rows = []
    for (model, world, run, phase, band), g in st[st.method == "scape"].groupby(
            ["model", "world_size", "run", "phase", "band"], sort=False):
        s = summary(g.elapsed_ms / 1e3)
        bases = {"dense AdamS": dense[(dense.model == model) & (dense.world_size == world)],
                 "its own dense phase": st[(st.run == run) & (st.phase == "dense phase")]}
        for name, base in bases.items():
            if base.empty or phase == "dense phase" and name != "dense AdamS":
                continue
            b = summary(base.elapsed_ms / 1e3)
            rows.append({"model": model, "world_size": world, "run": run, "phase": phase,
                         "band": band, "density": float(g.density.median()),
                         "baseline": name, "scape_s": s["median_s"], "baseline_s": b["median_s"],
                         "n_scape": s["n"], "n_baseline": b["n"], **ratio(b, s)})
    return pd.DataFrame(rows)


def pooled(df: pd.DataFrame, **where: Any) -> dict[str, float]:
    """The step-time summary of the steady steps matching ``where`` (column = value; ``phase``
    included)."""
    st = _steady_phases(df)
    mask = pd.Series(True, index=st.index)
    for k, v in where.items():
        mask &= st[k] == v
    return summary(st[mask].elapsed_ms / 1e3)


def _t_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    if x.size < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def matched_pairs(df: pd.DataFrame, column: str = "lm_loss") -> pd.DataFrame:
    """Every SCAPE row beside the dense row of the same model, global batch (so the same
    samples: the data order follows the iteration) and iteration, ``column`` of both."""
    s = df[(df.method == "scape") & df[column].notna()]
    d = df[(df.method != "scape") & df[column].notna()]
    d = d.drop_duplicates(["model", "iteration"], keep="last")
    m = s.merge(d[["model", "iteration", column, "run", "world_size"]],
                on=["model", "iteration"], suffixes=("", "_dense"))
    return m.rename(columns={column: "scape", f"{column}_dense": "dense"})


def matched_loss(df: pd.DataFrame, column: str = "lm_loss") -> pd.DataFrame:
    """Per SCAPE run and block of matched iterations: the mean ``column`` of SCAPE and of dense
    AdamS, the relative difference ``scape / dense - 1`` (mean over the iterations) with its
    95 % t interval, and the density SCAPE sent there."""
    m = add_blocks(label_phases(matched_pairs(df, column)))
    rows = []
    for (run, block), g in m.groupby(["run", "block"], sort=False):
        rel = (g.scape / g.dense - 1).to_numpy()
        lo, hi = _t_interval(rel)
        rows.append({"run": run, "dense_run": g.run_dense.iloc[0], "iterations": block,
                     "n": len(g), "phase": g.phase.iloc[0], "density": float(g.density.median()),
                     "scape_loss": float(g.scape.mean()), "dense_loss": float(g.dense.mean()),
                     "rel_diff": float(rel.mean()), "rel_low": lo, "rel_high": hi})
    return pd.DataFrame(rows)


def loss_curves(df: pd.DataFrame, window: int = 8) -> pd.DataFrame:
    """Matched lm losses with rolling means and standard deviations over ``window``
    iterations inside each block (for the plot of SCAPE against dense)."""
    m = add_blocks(matched_pairs(df))
    parts = []
    for _, g in m.groupby(["run", "block"], sort=False):
        g = g.sort_values("iteration").copy()
        for c in ("scape", "dense"):
            roll = g[c].rolling(window, min_periods=max(2, window // 2))
            g[f"{c}_mean"], g[f"{c}_sd"] = roll.mean(), roll.std()
        parts.append(g)
    cols = ["run", "block", "iteration", "density", "scape", "dense", "scape_mean", "scape_sd",
            "dense_mean", "dense_sd"]
    return pd.concat(parts)[cols] if parts else pd.DataFrame(columns=cols)


def density_fit(df: pd.DataFrame, model: str, world: int) -> dict[str, float]:
    """Step seconds ``a + b * density`` fitted (least squares) to the steady SCAPE steps of
    ``model`` on ``world`` ranks outside the dense phase; ``r2`` and the densities covered."""
    st = _steady_phases(df)
    g = st[(st.method == "scape") & (st.model == model) & (st.world_size == world)
           & (st.phase != "dense phase")]
    if g.density.nunique() < 2:
        return {"a": math.nan, "b": math.nan, "r2": math.nan, "n": len(g),
                "d_min": math.nan, "d_max": math.nan}
    y = g.elapsed_ms.to_numpy() / 1e3
    b, a = np.polyfit(g.density.to_numpy(), y, 1)
    resid = y - (a + b * g.density.to_numpy())
    return {"a": float(a), "b": float(b), "r2": float(1 - resid.var() / y.var()), "n": len(g),
            "d_min": float(g.density.min()), "d_max": float(g.density.max())}


def wall_from_logs(df: pd.DataFrame, model: str, world: int, target: float, total: int,
                   dense_steps: int, ramp_steps: int) -> dict[str, Any]:
    """The whole-run saving the logs' own step times give over a schedule: SCAPE's dense phase
    at its measured median, the linear warm-up and the rest at :func:`density_fit`'s line,
    against ``total`` dense AdamS steps at their median (low / high: at the dense IQR ends);
    ``extrapolated`` when ``target`` lies below the densities measured."""
    fit = density_fit(df, model, world)
    dense = pooled(df, model=model, world_size=world, method="adams")
    own = pooled(df, model=model, world_size=world, phase="dense phase")
    line = lambda d: fit["a"] + fit["b"] * d    # noqa: E731
    scape = (dense_steps * own["median_s"] + ramp_steps * line((1 + target) / 2)
             + (total - dense_steps - ramp_steps) * line(target))
    out = {"target_density": target, "scape_run_s": scape, **{f"fit_{k}": v
                                                              for k, v in fit.items()}}
    for key, q in (("saving", "median_s"), ("saving_low", "q1_s"), ("saving_high", "q3_s")):
        out[key] = 1 - scape / (total * dense[q])
    out["extrapolated"] = bool(target < fit["d_min"] * (1 - TARGET_TOLERANCE))
    return out


def coverage(df: pd.DataFrame, provenance: dict[str, Any], page_chars: int = 16000
             ) -> pd.DataFrame:
    """Per log: the iterations read (blocks), whether its last page was read (then the log's
    last iteration is known), the furthest phase and density SCAPE reached, and whether the
    log ends before the target density."""
    tails = {f["path"]: any(p["offset"] + page_chars >= int(f.get("total_chars") or 0) > 0
                            and p["last_iteration"] is not None for p in f["pages"])
             for f in provenance.get("files", [])}
    rows = []
    for (path, run), g in add_blocks(label_phases(df)).groupby(["path", "run"], sort=False):
        last = g.loc[g.iteration.idxmax()]
        tail = tails.get(path, False)
        rows.append({"run": run, "method": last.method, "world_size": last.world_size,
                     "blocks": ", ".join(dict.fromkeys(g.block)),
                     "last_iteration_read": int(last.iteration), "log_end_read": tail,
                     "last_phase": last.phase, "last_density": float(last.density),
                     "target_density": float(last.target_density),
                     "ends_before_target": bool(tail and last.method == "scape"
                                                and last.phase != "target")})
    return pd.DataFrame(rows)


def allocation_day(run: str) -> float:
    """The day (UTC, days since 1970) of the job a run's log names: the authors' log names
    end with a Unix time (``..._1774652822``); nan for a name without one."""
    tail = str(run).rsplit("_", 1)[-1]
    return float(int(tail) // 86400) if tail.isdigit() and len(tail) >= 9 else math.nan


def allocation_speedups(df: pd.DataFrame, model: str, world: int) -> pd.DataFrame:
    """Every pairing of a dense AdamS allocation (one log) with a SCAPE allocation at its
    target density, ``model`` on ``world`` ranks: dense median / SCAPE median with the range
    the two IQRs allow, and the days between the two jobs (0: the same day); same-day pairs
    first, then by the days apart."""
    st = _steady_phases(df)
    st = st[(st.model == model) & (st.world_size == world)]
    dense = st[st.method != "scape"]
    scape = st[(st.method == "scape") & (st.phase == "target")]
    rows = []
    for drun, d in dense.groupby("run", sort=True):
        b = summary(d.elapsed_ms / 1e3)
        for srun, g in scape.groupby("run", sort=True):
            s = summary(g.elapsed_ms / 1e3)
            apart = abs(allocation_day(srun) - allocation_day(drun))
            rows.append({"dense_run": drun, "scape_run": srun, "days_apart": apart,
                         "density": float(g.density.median()), "dense_s": b["median_s"],
                         "scape_s": s["median_s"], "n_dense": b["n"], "n_scape": s["n"],
                         **ratio(b, s)})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.sort_values(["days_apart", "dense_run", "scape_run"], na_position="last",
                           kind="stable").reset_index(drop=True)


def allocation_spread(pairs: pd.DataFrame) -> dict[str, float]:
    """The spread between allocations of :func:`allocation_speedups`: the median, lowest and
    highest ratio of medians over the pairings, their number, and the same-day pairings'
    ratio (nan when none)."""
    if pairs.empty:
        return {"pairings": 0, "median": math.nan, "min": math.nan, "max": math.nan,
                "same_day": math.nan, "same_day_min": math.nan, "same_day_max": math.nan,
                "dense_allocations": 0, "scape_allocations": 0}
    same = pairs[pairs.days_apart == 0]
    return {"pairings": len(pairs), "median": float(pairs.ratio.median()),
            "min": float(pairs.ratio.min()), "max": float(pairs.ratio.max()),
            "same_day": float(same.ratio.median()) if len(same) else math.nan,
            "same_day_min": float(same.ratio.min()) if len(same) else math.nan,
            "same_day_max": float(same.ratio.max()) if len(same) else math.nan,
            "dense_allocations": int(pairs.dense_run.nunique()),
            "scape_allocations": int(pairs.scape_run.nunique())}
