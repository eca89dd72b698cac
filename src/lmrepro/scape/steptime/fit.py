"""Calibrating the step-time model on the shaped-link benchmark and validating it on held-out
points (``bench/bench_scape_netns.py`` results; docs/steptime.md).

On the benchmark's link (2 gloo workers on one rate-limited loopback) a collective of ``n``
bytes per rank at rate ``R`` bit/s takes ``t = alpha + n (beta_mem + s * 8 / R)``: a latency, a
per-byte cost of the memory and the software (the unlimited link, ``R = inf``), and the bytes the
algorithm puts on the shared token bucket per byte handed in (``s``; 2 for a 2-rank all-reduce
whose two directions share one queue). ``alpha``, ``beta_mem`` and ``s`` are fitted per
collective by relative least squares on the message-size sweeps of every *fit* link at once.

The local constants come from the same links' compute-only steps (every collective replaced by
a local stand-in): forward/backward time, dense AdamW's update per parameter, and SCAPE's extra
work per parameter and per kept element (two sparsities give the two). A step is then predicted
as ``compute + local + all_reduce(values) + max(0, all_gather(mask) - forward/backward)``
and compared with the measured median of the timed blocks, on links (or model sizes) the fit
did not see.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: a held-out point passes when predicted within this fraction of the measured step
TOLERANCE = 0.15
KINDS = ("all_reduce", "all_gather")


def _rate(link: dict) -> float:
    r = link.get("rate_mbit")
    return math.inf if not r else float(r) * 1e6


#: how a collective's per-byte costs combine: ``overlapped``, ``n max(beta_mem, 8 s / R)`` (the
#: software's per-byte work runs while earlier chunks are on the wire, as gloo pipelines its
#: chunks), or ``serial``, ``n (beta_mem + 8 s / R)`` (the first form we fitted)
FORMS = ("overlapped", "serial")


def _design_row(n: float, inv: float, form: str, link_bound: bool) -> list[float]:
    if form == "serial":
        return [1.0, n, n * inv]
    return [1.0, 0.0, n * inv] if link_bound else [1.0, n, 0.0]


def fit_link_model(links: Sequence[dict], kind: str, min_bytes: int = 65536,
                   form: str = "overlapped") -> dict[str, Any]:
    """``alpha``, ``beta_mem`` and ``s`` of collective ``kind`` (``form``: :data:`FORMS`) over
    the sweeps of ``links`` (per-size medians, sizes >= min_bytes), relative least squares,
    every coefficient >= 0 (a negative one is dropped and the rest refitted). In the overlapped
    form a point is link-bound when ``8 s / R > beta_mem``; the assignment is iterated to a
    fixed point (shaped links start link-bound)."""
    if form not in FORMS:
        raise ValueError(f"form = {form!r}: must be one of {FORMS}")
    pts: list[tuple[float, float, float]] = []
    for link in links:
        if kind not in link.get("sweep_times_s", {}):
            continue
        inv = 0.0 if math.isinf(_rate(link)) else 8.0 / _rate(link)
        for n, ts in zip(link["sweep_sizes"], link["sweep_times_s"][kind]):
            if n >= min_bytes:
                pts.append((float(n), inv, float(np.median(ts))))
    if len(pts) < 3:
        raise ValueError(f"need >= 3 swept points of {kind} to fit; have {len(pts)}")
    y = np.array([p[2] for p in pts])
    bound = [inv > 0 for _, inv, _ in pts]
    for _ in range(10):
        coef = _nonnegative_fit(np.array([_design_row(n, inv, form, b)
                                          for (n, inv, _), b in zip(pts, bound)]), y)
        now = [inv > 0 and coef[2] * inv > coef[1] for _, inv, _ in pts]
        if form == "serial" or now == bound:
            break
        bound = now
    model = {"alpha_s": float(coef[0]), "beta_mem_s_per_byte": float(coef[1]),
             "link_bytes_per_byte": float(coef[2]), "form": form, "n_points": len(y)}
    pred = np.array([collective_s(model, n, 8.0 / inv if inv else math.inf) for n, inv, _ in pts])
    return {**model, "max_rel_err": float(np.max(np.abs(pred - y) / y))}


def _nonnegative_fit(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Relative least squares of ``a x = y`` with ``x >= 0`` (drop the most negative, refit)."""
    w = 1.0 / y
    active = [j for j in range(a.shape[1]) if np.any(a[:, j])]
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def collective_s(model: dict[str, Any], nbytes: float, rate_bit_s: float) -> float:
    """Seconds of one collective of ``nbytes`` per rank at ``rate_bit_s`` (inf: unshaped)."""
    if nbytes <= 0:
        return 0.0
    inv = 0.0 if math.isinf(rate_bit_s) else 8.0 / rate_bit_s
    beta, link = model["beta_mem_s_per_byte"], model["link_bytes_per_byte"] * inv
    per_byte = beta + link if model.get("form", "serial") == "serial" else max(beta, link)
    return model["alpha_s"] + nbytes * per_byte


def _runs(link: dict) -> dict[tuple[str, str], dict]:
    return {(r["method"], r["mode"]): r for r in link["raw_runs"]}


def _kept(run: dict) -> float:
    return run["bytes"]["grad_values"] / 4.0


def fit_local(links: Sequence[dict]) -> dict[str, float]:
    """Local constants from the compute-only steps of ``links``: the forward/backward seconds
    per parameter, AdamW's update per parameter, SCAPE's extra work per parameter and per kept
    element (a line through the SCAPE sparsities; medians over links)."""
    fb, dense, pts = [], [], []
    for link in links:
        runs = _runs(link)
        for (method, mode), r in runs.items():
            if mode != "compute":
                continue
            n = float(r["n_params"])
            fb.append(r["fwd_bwd_s"] / n)
            local = max(0.0, r["step_s"] - r["fwd_bwd_s"])
            if method == "adamw":
                dense.append(local / n)
            else:
                pts.append((method, n, _kept(r), local))
    u = float(np.median(dense))
    by: dict[str, list[tuple[float, float, float]]] = {}
    for m, n, k, local in pts:
        by.setdefault(m, []).append((n, k, local - u * n))
    med = [tuple(np.median(np.array(v), axis=0)) for v in by.values()]
    if len(med) >= 2:   # extra = e * n + q * k through the sparsities
        a = np.array([[n, k] for n, k, _ in med])
        y = np.array([x for _, _, x in med])
        (e, q), *_ = np.linalg.lstsq(a, y, rcond=None)
        if q < 0:
            q, e = 0.0, float(np.sum(y * a[:, 0]) / np.sum(a[:, 0] ** 2))
    else:
        e, q = (med[0][2] / med[0][0], 0.0) if med else (0.0, 0.0)
    return {"fwd_bwd_s_per_param": float(np.median(fb)), "dense_s_per_param": u,
            "scape_extra_s_per_param": max(0.0, float(e)), "s_per_kept": max(0.0, float(q))}


def predict_step(method: str, run: dict, rate_bit_s: float, models: dict[str, dict],
                 local: dict[str, float], fwd_bwd_s: float) -> float:
    """Predicted step of a benchmark method from its bytes, the link's rate, the fitted
    collectives and local constants, and its forward/backward seconds."""
    n = float(run["n_params"])
    b = run["bytes"]
    loc = n * local["dense_s_per_param"]
    if method != "adamw":
        loc += n * local["scape_extra_s_per_param"] + _kept(run) * local["s_per_kept"]
    step = fwd_bwd_s + loc + collective_s(models["all_reduce"], b["grad_values"], rate_bit_s)
    mask = collective_s(models["all_gather"], b.get("mask", 0), rate_bit_s)
    return step + max(0.0, mask - fwd_bwd_s)      # the mask gather hides behind fwd/bwd


def _spread(run: dict) -> tuple[float, float, float, int]:
    blocks = np.asarray(run.get("block_step_s") or [run["step_s"]], dtype=float)
    q1, med, q3 = np.percentile(blocks, [25, 50, 75])
    return float(med), float(q1), float(q3), int(run["steps"])


def roles(results: dict, holdout: Sequence[str] | None = None) -> dict[str, str]:
    """``label -> 'fit' | 'held-out'``: the links' own roles (calibration runs), else
    ``holdout`` (default: the fastest shaped link) held out and the rest fitted."""
    links = results["links"]
    if all("role" in v for v in links.values()):
        return {k: v["role"] for k, v in links.items()}
    if holdout is None:
        shaped = sorted((v["rate_mbit"], k) for k, v in links.items() if v.get("rate_mbit"))
        holdout = [shaped[-1][1]] if shaped else []
    return {k: ("held-out" if k in holdout else "fit") for k in links}


def calibrate(results: dict, holdout: Sequence[str] | None = None, min_bytes: int = 65536,
              form: str = "overlapped") -> dict[str, Any]:
    """Fit on the fit links, predict every (link, method): measured median step with its
    interquartile range over the timed blocks and the number of timed steps, predicted step,
    relative error, and whether each held-out point is within :data:`TOLERANCE`; with the
    held-out result of every other form of :data:`FORMS` beside (``other_forms``)."""
    out = _calibrate(results, holdout, min_bytes, form)
    out["other_forms"] = {
        f: {k: r[k] for k in ("held_out_pass", "held_out_max_abs_error")} | {
            "link_bytes_per_byte": {k: m["link_bytes_per_byte"] for k, m in r["models"].items()}}
        for f in FORMS if f != form for r in [_calibrate(results, holdout, min_bytes, f)]}
    return out


def _calibrate(results: dict, holdout: Sequence[str] | None, min_bytes: int, form: str
               ) -> dict[str, Any]:
    role = roles(results, holdout)
    links = results["links"]
    fit = [links[k] for k in links if role[k] == "fit"]
    models = {k: fit_link_model(fit, k, min_bytes, form) for k in KINDS}
    local = fit_local(fit)
    rows = []
    for label, link in links.items():
        runs = _runs(link)
        for (method, mode), run in runs.items():
            if mode != "real":
                continue
            # the held-out model size's compute is its own measured compute-only step
            comp = runs.get((method, "compute"))
            fb = comp["fwd_bwd_s"] if comp else local["fwd_bwd_s_per_param"] * run["n_params"]
            pred = predict_step(method, run, _rate(link), models, local, fb)
            med, q1, q3, steps = _spread(run)
            rows.append({"link": label, "rate_mbit": link.get("rate_mbit"),
                         "n_params": run["n_params"], "method": method, "role": role[label],
                         "measured_s": med, "q1_s": q1, "q3_s": q3, "blocks":
                         len(run.get("block_step_s") or [1]), "timed_steps": steps,
                         "predicted_s": pred, "rel_error": pred / med - 1.0,
                         "within_tolerance": abs(pred / med - 1.0) <= TOLERANCE})
    held = [r for r in rows if r["role"] == "held-out"]
    return {"form": form, "models": models, "local": local, "rows": rows, "tolerance": TOLERANCE,
            "fit_links": [k for k in links if role[k] == "fit"],
            "held_out_links": [k for k in links if role[k] == "held-out"],
            "held_out_pass": bool(held) and all(r["within_tolerance"] for r in held),
            "held_out_max_abs_error": max((abs(r["rel_error"]) for r in held), default=None)}
