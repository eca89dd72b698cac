"""The report section "What the authors' logs measured" (``notebooks/09_steptime.ipynb``, the
``steptime`` stage) and the evidence the claims table takes from the logs.

:func:`evidence` computes everything once from the committed table of the SCAPE authors' Vista
logs (:func:`lmrepro.scape.authors.logs.load_vista_table`): step times per run and density
phase (:mod:`lmrepro.scape.authors.analysis`), the measured per-step speedup, SCAPE against
dense lm loss at matched iterations, where the logs stop, and the step-time model fitted to
them (:mod:`lmrepro.scape.authors.fit`) with the paper's figures evaluated at the fitted
inputs and at 200 / 400 Gbit/s; the texts the claims table quotes; which claims the logs support.
:mod:`lmrepro.scape.authors.page` writes the section's tables and figure. Every figure is
computed here; none is typed.
"""

from __future__ import annotations

import functools
from typing import Any

import pandas as pd

from lmrepro.scape.authors import analysis as aa
from lmrepro.scape.authors import logs as al
from lmrepro.scape.authors import fit
from lmrepro.scape.steptime import paper as sp

MODEL = sp.LLAMA_500M
WORLD = sp.PAPER_WORLD


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def measured_speedup(df: pd.DataFrame) -> dict[str, float]:
    """Dense AdamS over SCAPE at its target density, pooled steady steps of ``MODEL`` on
    ``WORLD`` ranks: ratio of medians and the range the IQRs allow; the target density."""
    dense = aa.pooled(df, model=MODEL.name, world_size=WORLD, method="adams")
    scape = aa.pooled(df, model=MODEL.name, world_size=WORLD, phase="target")
    targets = df[(df.method == "scape") & (df.world_size == WORLD)].target_density.dropna()
    return {**aa.ratio(dense, scape), "dense_s": dense["median_s"],
            "scape_s": scape["median_s"], "n_dense": dense["n"], "n_scape": scape["n"],
            "target_density": float(targets.iloc[0]) if len(targets) else float("nan")}


@functools.lru_cache(maxsize=1)
def evidence() -> dict[str, Any]:
    """Everything the section and the claims table take from the committed logs' table."""
    df = al.load_vista_table()
    prov = al.vista_provenance()
    central, corners, inputs = fit.fit_from_logs(df, MODEL)
    speed = measured_speedup(df)
    pairs = aa.allocation_speedups(df, MODEL.name, WORLD)
    validation = fit.validation_frame(df, MODEL)
    error = fit.validated_error(validation)
    return {"table": df, "provenance": prov, "step_times": aa.step_times(df),
            "allocations": pairs, "allocation_spread": aa.allocation_spread(pairs),
            "validation": validation, "validated_error": error,
            "speedups": aa.speedups(df), "speedup": speed,
            "loss": pd.concat([aa.matched_loss(df).assign(measure="lm loss (training)"),
                               aa.matched_loss(df, "val_loss").assign(measure="validation loss")],
                              ignore_index=True),
            "coverage": aa.coverage(df, prov), "fit": central, "corners": corners,
            "fit_summary": fit.fit_summary(central, corners),
            "held_out": fit.held_out_frame(central, corners, inputs, MODEL),
            "paper": fit.with_validated_error(fit.paper_at(central, corners), error),
            "needed": fit.needed_gbit(central),
            "wall_logs": aa.wall_from_logs(df, MODEL.name, WORLD, speed["target_density"],
                                           MODEL.total_steps, MODEL.dense_steps,
                                           MODEL.ramp_steps),
            "dense_scaling": {int(p): aa.pooled(df, model=MODEL.name, method="adams",
                                                world_size=p)["median_s"]
                              for p in sorted(df[df.method == "adams"].world_size.unique())}}


def _paper_row(ev: dict[str, Any], claim: str, sparsity: float, inputs: str) -> pd.Series:
    p = ev["paper"]
    return p[(p.claim == claim) & (p.sparsity == sparsity) & (p.inputs == inputs)].iloc[0]


def measured_speed_text(ev: dict[str, Any]) -> str:
    """The per-step speedup the logs measure at the target density: pooled, per same-day
    pairing, and its spread between allocations (every dense/SCAPE pairing)."""
    s, a = ev["speedup"], ev["allocation_spread"]
    same = ("" if a["same_day"] != a["same_day"]
            else f"same-day pairings {a['same_day_min']:.2f}-{a['same_day_max']:.2f}x; ")
    return (f"measured in the authors' logs at {s['target_density']:g} sent: "
            f"{s['ratio']:.2f}x per step pooled ({s['low']:.2f}-{s['high']:.2f}x from the "
            f"IQRs; dense AdamS {s['dense_s']:.3f} s, SCAPE {s['scape_s']:.3f} s); {same}"
            f"between allocations {a['min']:.2f}-{a['max']:.2f}x (median {a['median']:.2f}x over "
            f"{a['pairings']} pairings of {a['dense_allocations']} dense and "
            f"{a['scape_allocations']} SCAPE jobs; {MODEL.name}, {WORLD} GH200)")


def measured_wall_text(ev: dict[str, Any]) -> str:
    """The whole-run saving the logs' own step times give at the density they ran."""
    w = ev["wall_logs"]
    return (f"the logs' step times over the paper's schedule ({MODEL.total_steps:,} iterations, "
            f"{MODEL.dense_steps:,} dense, {MODEL.ramp_steps:,} warm-up) at "
            f"{w['target_density']:g} sent: {_pct(w['saving'])} less ({_pct(w['saving_low'])}-"
            f"{_pct(w['saving_high'])} at the dense IQR's ends)")


def _error_text(ev: dict[str, Any]) -> str:
    lo, hi = ev["validated_error"]
    v = ev["validation"]
    wrong = v[(v.measured_speedup - 1) * (v.loo_speedup - 1) < 0]
    signs = "".join(f"; the wrong sign on {int(r.world_size)} ranks at {r.density:.2f} sent: "
                    f"{r.loo_speedup:.3f}x predicted, {r.measured_speedup:.3f}x measured"
                    for r in wrong.itertuples())
    return (f"its SCAPE steps off by {100 * lo:+.1f} % to {100 * hi:+.1f} % out of sample "
            f"(leave one out over the {len(v)} SCAPE points of the logs, "
            f"{v.density.min():.0%}-{v.density.max():.0%} sent, "
            f"{', '.join(str(int(x)) for x in sorted(v.world_size.unique()))} ranks{signs})")


def speed_text(ev: dict[str, Any]) -> str:
    """The paper's 3.26x: not measured in the logs; the fitted model's extrapolation with its
    validated error."""
    r = _paper_row(ev, "per-step speedup", 0.99, "fitted to the logs")
    return (f"not measured in the authors' logs (no {sp.LLAMA_1_8B.name} log, none at 1 % "
            f"sent); our step-time model's extrapolation, fitted to them: {r.low:.2f}-"
            f"{r.high:.2f}x for {sp.LLAMA_1_8B.name} at 99 %, {r.validated_low:.2f}-"
            f"{r.validated_high:.2f}x with {_error_text(ev)}")


def wall_text(ev: dict[str, Any]) -> str:
    """The paper's 43.3 %: not measured in the logs; the model's extrapolation at 99 %."""
    r = _paper_row(ev, "whole-run saving", 0.99, "fitted to the logs")
    return (f"not measured in the authors' logs (no log at 1 % sent, none reaches "
            f"{MODEL.total_steps:,} iterations); our step-time model's extrapolation at 99 % "
            f"(the preset): {_pct(r.low)}-{_pct(r.high)} less, {_pct(r.validated_low)}-"
            f"{_pct(r.validated_high)} with {_error_text(ev)}")


def support_frame(ev: dict[str, Any]) -> pd.DataFrame:
    """Which of the paper's claims the logs support, and where they stop."""
    cov, loss = ev["coverage"], ev["loss"]
    scape_end = int(cov[cov.method == "scape"].last_iteration_read.max())
    dense_end = int(cov[cov.method != "scape"].last_iteration_read.max())
    lm = loss[loss.measure == "lm loss (training)"]
    lm = lm[lm.phase != "dense phase"]
    early = cov[cov.ends_before_target]
    sc = ev["dense_scaling"]
    last_matched = int(lm.iterations.str.split("-").str[1].astype(int).max()) if len(lm) else 0
    stop_99 = ("; the SCAPE line is extrapolated below the densities logged"
               if ev["wall_logs"]["extrapolated"] else "")
    rows = [
        ("per-step speedup", measured_speed_text(ev) + "; " + speed_text(ev),
         f"no {sp.LLAMA_1_8B.name} log and no log at 99 % sparsity (the d_0.01 folder holds a "
         f"launch script only): the paper's {sp.PAPER_STEP_SPEEDUP}x is reached by the model "
         "fitted to the logs, not measured"),
        ("whole-run wall-clock", measured_wall_text(ev) + "; " + wall_text(ev),
         f"no log reaches {MODEL.total_steps:,} iterations (SCAPE read to {scape_end:,}, dense "
         f"AdamS to {dense_end:,}); no log at 99 %: the model carries the fit there{stop_99}"),
        ("quality (lm loss)", "; ".join(
            f"iterations {r.iterations} at {r.density:.2f} sent: SCAPE {r.rel_diff:+.2%} "
            f"({r.rel_low:+.2%} to {r.rel_high:+.2%}) against dense AdamS" for r in
            lm.itertuples()),
         f"matched iterations only up to {last_matched:,} (the dense log on 4 ranks; SCAPE on "
         "32, same global batch and samples): none at the "
         "target density; the t intervals treat the iterations as independent (they are not: "
         "successive losses are correlated), so they understate the uncertainty"),
        ("scaling", "dense AdamS " + ", ".join(f"{p} ranks {t:.2f} s" for p, t in sc.items()),
         "no SCAPE log on another world size was read: SCAPE's scaling is not measured; the "
         "model's weak scaling is a property of a model with no congestion term"),
        ("runs that stop early", "; ".join(
            f"{r.run} ends at iteration {r.last_iteration_read:,} at {r.last_density:.4f} sent "
            f"(target {r.target_density:g})" for r in early.itertuples()) or "none",
         "a run that ends before its target density measures nothing about that density"),
    ]
    return pd.DataFrame(rows, columns=["claim", "what the logs measured", "where they stop"])
