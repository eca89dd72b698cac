"""The step-time model (:mod:`lmrepro.scape.steptime.model`) fitted to the SCAPE authors' own step
times (their Vista logs, :mod:`lmrepro.scape.authors.logs`).

* **Dense fit.** Dense AdamS on 4 and 32 ranks (one GH200 per node, ring all-reduce of fp32
  gradients, no overlap: the authors' flags) gives two equations linear in ``1 / MFU`` and
  ``1 / B``: ``t_p = F / (p peak) / MFU + u N + 2 (p-1) alpha + 2 (p-1)/p 4N / B``; solved
  exactly, so the model reproduces both medians. ``B`` is the *effective* per-node rate the
  dense all-reduce got, not a link's nominal rate.
* **SCAPE overhead.** The model prices SCAPE's local work as memory passes; the logs' SCAPE
  steps at density ~1 (right after the dense phase, when the values all-reduce moves as many
  bytes as the dense one) are slower than that by a measured ``overhead_s``: the selection
  kernels and per-tensor work the passes leave out. Whether it grows with the parameters or
  is fixed per step is not measured (one model size): both are carried to other models, and
  the range between them is part of every interval.
* **Held out.** The SCAPE steps at densities 0.77, 0.22 and 0.1 are not fitted: the model's
  predictions are checked against them.

Intervals: every fit is repeated at the ends of the dense steps' interquartile ranges (4
corners); a prediction's interval spans the corners and both overhead scalings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from lmrepro.errors import check
from lmrepro.scape.authors import analysis as aa
from lmrepro.scape.steptime import paper as sp
from lmrepro.scape.steptime.model import (Cluster, Link, LocalWork, Options, Workload,
                                          bandwidth_for_speedup, predict, run_wallclock, scape_step)

PEAK_FLOPS = 989e12
HBM = 4e12
ALPHA_S = 5e-6
#: a SCAPE step "at density ~1": the first warm-up steps, everything but a few per mille sent
NEAR_DENSE = 0.99
SCALINGS = ("per parameter", "per step")


@dataclass(frozen=True)
class LogFit:
    """MFU and effective per-node network rate fitted to dense steps, and SCAPE's measured
    overhead over the model (seconds per step of a model of ``params`` parameters)."""

    mfu: float
    gbit: float
    overhead_s: float
    params: float

    def cluster(self, world: int = sp.PAPER_WORLD, gbit: float | None = None) -> Cluster:
        """Vista's GH200 nodes, one GPU each, at the fitted MFU and rate (or ``gbit``)."""
        rate = self.gbit if gbit is None else gbit
        return Cluster(world=world, inter=Link(ALPHA_S, rate * 1e9 / 8), mfu=self.mfu,
                       peak_flops=PEAK_FLOPS, hbm_bytes_per_s=HBM)

    def local(self, scaling: str = "per parameter") -> LocalWork:
        """Memory passes plus the overhead, carried ``per parameter`` or ``per step``."""
        check(scaling in SCALINGS, "scaling", scaling, f"must be one of {SCALINGS}")
        if scaling == "per step":
            return LocalWork.from_hbm(HBM, selection_s_per_step=self.overhead_s)
        return LocalWork.from_hbm(HBM, selection_s_per_param=self.overhead_s / self.params)


def fit_dense(steps: dict[int, float], w: Workload) -> tuple[float, float]:
    """(MFU, bytes/s per node) at which the model gives the dense ``steps`` (seconds, keyed by
    world size; two of them); bad input: one line naming the step times."""
    check(len(steps) == 2 and min(steps) >= 2, "dense step times", steps,
          "must be two world sizes >= 2")
    fpt = w.flops_per_token if w.flops_per_token is not None else 6 * w.params
    flops = w.tokens_per_step * fpt
    update = w.params * LocalWork.from_hbm(HBM).dense_s_per_param
    rows, rhs = [], []
    for p, t in sorted(steps.items()):
        rows.append([flops / (p * PEAK_FLOPS), 2 * (p - 1) / p * 4 * w.params])
        rhs.append(t - update - 2 * (p - 1) * ALPHA_S)
    inv_mfu, s_per_byte = np.linalg.solve(np.array(rows), np.array(rhs))
    check(inv_mfu >= 1 and s_per_byte > 0, "dense step times", steps,
          "must fit an MFU in (0, 1] and a positive network rate")
    return float(1 / inv_mfu), float(1 / s_per_byte)


def overhead(measured_s: float, density: float, mfu: float, bytes_per_s: float, w: Workload,
             world: int = sp.PAPER_WORLD) -> float:
    """A measured SCAPE step at ``density`` on ``world`` ranks less the model's step without
    the overhead."""
    c = Cluster(world=world, inter=Link(ALPHA_S, bytes_per_s), mfu=mfu,
                peak_flops=PEAK_FLOPS, hbm_bytes_per_s=HBM)
    return measured_s - scape_step(w, c, Options(sparsity=1 - density),
                                   LocalWork.from_hbm(HBM))["step_s"]


def log_inputs(df: pd.DataFrame, model: str = sp.LLAMA_500M.name) -> dict[str, Any]:
    """The step-time summaries the fit uses: dense AdamS per world size, SCAPE at density ~1
    (32 ranks), and the held-out SCAPE bands (warm-up bands and the target)."""
    dense = {int(p): aa.pooled(df, model=model, method="adams", world_size=p)
             for p in sorted(df[(df.model == model) & (df.method == "adams")].world_size.unique())}
    st = aa.label_phases(aa.steady(df))
    scape = st[(st.model == model) & (st.method == "scape") & (st.world_size == sp.PAPER_WORLD)]
    near = scape[(scape.phase == "warm-up") & (scape.density >= NEAR_DENSE)]
    held = []
    for band, g in aa.step_times(df).groupby(["phase", "band"], sort=False):
        g = g[(g.model == model) & (g.method == "scape") & (g.world_size == sp.PAPER_WORLD)]
        if g.empty or band[0] == "dense phase" or (band[0] == "warm-up"
                                                   and g.density.min() >= NEAR_DENSE):
            continue
        rows = scape[scape.run.isin(g.run) & (scape.phase == band[0])]
        if band[0] == "warm-up":
            rows = rows[(rows.density - g.density.median()).abs() < 0.02]
        held.append({"phase": band[0], "density": float(rows.density.median()),
                     **aa.summary(rows.elapsed_ms / 1e3)})
    return {"dense": dense, "near_dense": {"density": float(near.density.median()),
                                           **aa.summary(near.elapsed_ms / 1e3)},
            "held_out": held}


def fit_from_logs(df: pd.DataFrame, model: sp.PaperModel = sp.LLAMA_500M
                  ) -> tuple[LogFit, list[LogFit], dict[str, Any]]:
    """The central fit (medians), the fits at the 4 corners of the dense IQRs, and the
    inputs (:func:`log_inputs`)."""
    inputs = log_inputs(df, model.name)
    dense = inputs["dense"]
    check(len(dense) == 2, "dense logs", sorted(dense), "must cover two world sizes")
    w = model.workload()
    near = inputs["near_dense"]

    def one(t: dict[int, float]) -> LogFit:
        mfu, bps = fit_dense(t, w)
        return LogFit(mfu, bps * 8 / 1e9, overhead(near["median_s"], near["density"], mfu, bps,
                                                   w), w.params)

    small, large = sorted(dense)
    central = one({p: dense[p]["median_s"] for p in dense})
    corners = [one({small: dense[small][a], large: dense[large][b]})
               for a in ("q1_s", "q3_s") for b in ("q1_s", "q3_s")]
    return central, corners, inputs


def held_out_frame(central: LogFit, corners: list[LogFit], inputs: dict[str, Any],
                   model: sp.PaperModel = sp.LLAMA_500M) -> pd.DataFrame:
    """Measured against predicted step times: the fitted points (dense 4 and 32 ranks, SCAPE
    at density ~1) and the held-out SCAPE bands."""
    w = model.workload()
    points = [("fitted", "dense AdamS", p, 1.0, s) for p, s in inputs["dense"].items()]
    near = inputs["near_dense"]
    points.append(("fitted", "SCAPE", sp.PAPER_WORLD, near["density"], near))
    points += [("held out", "SCAPE", sp.PAPER_WORLD, h["density"], h)
               for h in inputs["held_out"]]
    rows = []
    for role, method, p, d, s in points:
        def step(f: LogFit, method: str = method, p: int = p, d: float = d) -> float:
            r = predict(w, f.cluster(world=p), Options(sparsity=1 - d), f.local())
            return float(r["dense_step_s" if method == "dense AdamS" else "scape_step_s"])

        pred = [step(f) for f in corners]
        rows.append({"role": role, "method": method, "world_size": p, "density": d,
                     "n": s["n"], "measured_s": s["median_s"], "measured_q1_s": s["q1_s"],
                     "measured_q3_s": s["q3_s"], "predicted_s": step(central),
                     "predicted_low_s": min(pred), "predicted_high_s": max(pred),
                     "rel_error": step(central) / s["median_s"] - 1})
    return pd.DataFrame(rows)


def _value(kind: str, m: sp.PaperModel, sparsity: float, f: LogFit, gbit: float | None,
           scaling: str) -> float:
    o = Options(sparsity=sparsity)
    c, local = f.cluster(gbit=gbit), f.local(scaling)
    if kind == "speedup":
        return float(predict(m.workload(), c, o, local)["speedup"])
    return float(run_wallclock(m.workload(), c, o, m.total_steps, m.dense_steps, m.ramp_steps,
                               local)["saving"])


#: the paper's figures evaluated: (claim, kind, model, sparsity, the paper's figure)
CLAIMS = (("per-step speedup", "speedup", sp.LLAMA_1_8B, 0.99, sp.PAPER_STEP_SPEEDUP),
          ("whole-run saving", "saving", sp.LLAMA_500M, 0.99, sp.PAPER_WALL_SAVING),
          ("whole-run saving", "saving", sp.LLAMA_500M, 0.9, sp.PAPER_WALL_SAVING))


def paper_at(central: LogFit, corners: list[LogFit],
             gbits: tuple[float, ...] = sp.INTER_GBIT_RANGE) -> pd.DataFrame:
    """The paper's 3.26x (Llama-1.8B, 99 %) and 43.3 % (Llama-500M; at 99 %, the preset, and
    at 90 %, what the logs ran) at the fitted inputs and with the network at ``gbits``
    (MFU and overhead as fitted): central value and interval (corners x overhead scalings)."""
    rows = []
    for claim, kind, m, s, paper in CLAIMS:
        for gbit in (None, *gbits):
            vals = [_value(kind, m, s, f, gbit, sc) for f in corners for sc in SCALINGS]
            mid = [_value(kind, m, s, central, gbit, sc) for sc in SCALINGS]
            rate = central.gbit if gbit is None else gbit
            rows.append({"claim": claim, "model": m.name, "params": m.params()[0],
                         "sparsity": s, "paper": paper,
                         "inputs": "fitted to the logs" if gbit is None else f"{gbit:g} Gbit/s",
                         "inter_node_gbit": rate, "mfu": central.mfu,
                         "value_per_parameter": mid[0], "value_per_step": mid[1],
                         "low": min(vals), "high": max(vals),
                         "paper_inside": min(vals) <= paper <= max(vals)})
    return pd.DataFrame(rows)


def needed_gbit(central: LogFit, target: float = sp.PAPER_STEP_SPEEDUP,
                model: sp.PaperModel = sp.LLAMA_1_8B) -> dict[str, float | None]:
    """Per overhead scaling: the per-node rate at which ``model`` at its sparsity reaches
    ``target`` (default the paper's 3.26x) and the rate above which SCAPE stops paying
    (speedup 1), at the fitted MFU and overhead."""
    out: dict[str, float | None] = {}
    o = Options(sparsity=model.sparsity)
    for sc in SCALINGS:
        key = sc.replace(" ", "_")
        for name, t in (("target", target), ("break_even", 1.0)):
            g = bandwidth_for_speedup(t, model.workload(), central.cluster(), o,
                                      local=central.local(sc))
            out[f"{name}_gbit_{key}"] = None if g is None or not math.isfinite(g) else g
    return out


def fit_summary(central: LogFit, corners: list[LogFit]) -> dict[str, Any]:
    """The fit in numbers: MFU, effective rate and overhead, central and over the corners."""
    def span(attr: str) -> tuple[float, float]:
        v = [getattr(f, attr) for f in corners]
        return min(v), max(v)

    return {"mfu": central.mfu, "mfu_range": span("mfu"), "gbit": central.gbit,
            "gbit_range": span("gbit"), "overhead_s": central.overhead_s,
            "overhead_range_s": span("overhead_s"), "params": central.params,
            "overhead_s_per_param": central.overhead_s / central.params}


def replace_rate(f: LogFit, gbit: float) -> LogFit:
    """``f`` with the network at ``gbit`` per node."""
    return replace(f, gbit=gbit)


def scape_points(df: pd.DataFrame, model: str = sp.LLAMA_500M.name) -> pd.DataFrame:
    """Every SCAPE step-time point of ``model`` in the logs outside the dense phase: per world
    size, phase and warm-up band (as :func:`lmrepro.scape.authors.analysis.step_times` bands
    them), the steady steps of every run pooled; its density, median and IQR."""
    st = aa.step_times(df)
    st = st[(st.model == model) & (st.method == "scape") & (st.phase != "dense phase")]
    steady = aa.label_phases(aa.steady(df))
    rows = []
    for (world, phase, _band), g in st.groupby(["world_size", "phase", "band"], sort=True):
        r = steady[steady.run.isin(g.run) & (steady.phase == phase)
                   & (steady.world_size == world) & (steady.model == model)]
        if phase == "warm-up":
            r = r[(r.density - g.density.median()).abs() < 0.02]
        rows.append({"world_size": int(world), "phase": phase, "density": float(r.density.median()),
                     **aa.summary(r.elapsed_ms / 1e3)})
    return pd.DataFrame(rows).sort_values(["world_size", "density"], ascending=[True, False],
                                          ignore_index=True)


def validation_frame(df: pd.DataFrame, model: sp.PaperModel = sp.LLAMA_500M) -> pd.DataFrame:
    """The step-time model out of sample. MFU and rate are fitted to the dense steps (two
    world sizes, two parameters: no dense point can be left out); then every SCAPE point is
    predicted (a) from the dense fit alone (no overhead) and (b) with the overhead fitted to
    every *other* SCAPE point (the median of their implied overheads: leave one out), its
    relative error ``predicted / measured - 1`` printed for each."""
    inputs = log_inputs(df, model.name)
    dense = inputs["dense"]
    check(len(dense) == 2, "dense logs", sorted(dense), "must cover two world sizes")
    w = model.workload()
    mfu, bps = fit_dense({p: dense[p]["median_s"] for p in dense}, w)
    pts = scape_points(df, model.name)
    implied = [overhead(r.median_s, r.density, mfu, bps, w, int(r.world_size))
               for r in pts.itertuples()]
    rows = []
    for i, r in enumerate(pts.itertuples()):
        others = [o for j, o in enumerate(implied) if j != i]
        loo = float(np.median(others)) if others else math.nan

        def step(over: float, r: Any = r) -> float:
            f = LogFit(mfu, bps * 8 / 1e9, over, w.params)
            return float(predict(w, f.cluster(world=int(r.world_size)),
                                 Options(sparsity=1 - r.density), f.local())["scape_step_s"])

        base = dense[int(r.world_size)]["median_s"] if int(r.world_size) in dense else math.nan
        rows.append({"world_size": r.world_size, "phase": r.phase, "density": r.density,
                     "n": r.n, "measured_s": r.median_s, "measured_q1_s": r.q1_s,
                     "measured_q3_s": r.q3_s, "implied_overhead_s": implied[i],
                     "dense_only_s": step(0.0), "dense_only_error": step(0.0) / r.median_s - 1,
                     "loo_overhead_s": loo, "loo_s": step(loo),
                     "loo_error": step(loo) / r.median_s - 1,
                     "measured_speedup": base / r.median_s, "loo_speedup": base / step(loo)})
    return pd.DataFrame(rows)


def validated_error(v: pd.DataFrame) -> tuple[float, float]:
    """The leave-one-out errors' range over the SCAPE points (lowest, highest)."""
    return float(v.loo_error.min()), float(v.loo_error.max())


def with_validated_error(paper: pd.DataFrame, error: tuple[float, float]) -> pd.DataFrame:
    """:func:`paper_at`'s rows with the interval widened by the validated SCAPE-step error
    ``(lo, hi)`` (``predicted / measured - 1``): a SCAPE step predicted ``e`` too long means
    the true speedup is ``(1 + e)`` times the predicted one and the true SCAPE run ``1 / (1 +
    e)`` as long, so the saving becomes ``1 - (1 - s) / (1 + e)``."""
    lo, hi = error
    out = paper.copy()
    speed = out.claim == "per-step speedup"
    out["validated_low"] = np.where(speed, out.low * (1 + lo), 1 - (1 - out.low) / (1 + lo))
    out["validated_high"] = np.where(speed, out.high * (1 + hi), 1 - (1 - out.high) / (1 + hi))
    out["validated_error_low"], out["validated_error_high"] = lo, hi
    return out
