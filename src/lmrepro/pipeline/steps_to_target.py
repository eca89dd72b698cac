"""Steps to target: how many more optimizer steps a method needs than its baseline to reach the
same loss (a compute multiplier), read off loss curves evaluated along each run.

A gap at one training length mixes how far apart two methods are with when each leaves a plateau
and where the schedule ends; the multiplier asks instead "for this loss, how many steps?". For a
target loss T and a seed, ``multiplier = steps_candidate(T) / steps_baseline(T)``, where
``steps(T)`` is the first step count at which the curve reaches T, interpolated linearly in
``log(steps)`` between the two evaluations around the crossing (:func:`crossing`). The seed is
the unit: the per-seed log multipliers (paired by seed) give a two-sided Student t interval
(df = seeds - 1) around their mean, reported as a geometric-mean multiplier with its bounds. A
seed whose candidate never reaches T within its curve is *censored*: its last evaluated step
stands in, so the reported multiplier is then a lower bound (``censored`` > 0 says so) and
no interval is given.

The curves must come from a schedule whose lr at a step does not depend on the run's length
(warmup-stable-decay, :func:`lmrepro.evaluation.wsd_lr`, read in its stable phase), or every
point is confounded by its run's end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

#: a run's curve: (step counts, losses), step counts increasing
Curve = tuple[Sequence[int], Sequence[float]]


def crossing(steps: Sequence[int], losses: Sequence[float], target: float) -> float | None:
    """The first step count at which the curve reaches ``target`` (loss <= target), linearly
    interpolated in log(steps) between the evaluations around the crossing; the first step count
    when the first evaluation is already there; None when the curve never reaches it."""
    if len(steps) != len(losses) or not len(steps):
        raise ValueError(f"a curve needs as many step counts as losses (got {len(steps)} and "
                         f"{len(losses)}), at least one")
    for i, (s, y) in enumerate(zip(steps, losses)):
        if y <= target:
            if i == 0:
                return float(s)
            s0, y0 = steps[i - 1], losses[i - 1]
            frac = (y0 - target) / (y0 - y)
            return float(math.exp(math.log(s0) + frac * (math.log(s) - math.log(s0))))
    return None


def targets_between(floor: float, baseline_final: float, n: int = 8) -> list[float]:
    """``n`` target losses evenly spaced from ``floor`` (an n-gram floor, the first target)
    down to ``baseline_final`` (the highest final loss among the baseline's seeds, so every
    baseline seed reaches every target)."""
    if not baseline_final < floor:
        return []
    return [float(x) for x in np.linspace(floor, baseline_final, n)]


def log_interval(logs: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` multiplier: exp of the mean of per-seed log multipliers and of its
    two-sided Student t interval (df = seeds - 1; no interval from one seed)."""
    x = np.asarray(logs, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return math.exp(m), math.nan, math.nan
    half = float(sps.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def multiplier_rows(base: Mapping[int, Curve], cand: Mapping[int, Curve], targets: Sequence[float],
                    confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per target: the candidate's steps over the baseline's, paired by seed (seeds in both),
    with its t interval; ``censored`` counts seeds whose candidate never reached the target
    (their last evaluated step stands in: the multiplier is then a lower bound)."""
    seeds = sorted(set(base) & set(cand))
    rows = []
    for t in targets:
        logs, censored, b_steps, c_steps = [], 0, [], []
        for s in seeds:
            b = crossing(*base[s], t)
            if b is None:
                continue
            c = crossing(*cand[s], t)
            if c is None:
                censored += 1
                c = float(cand[s][0][-1])
            logs.append(math.log(c / b))
            b_steps.append(b)
            c_steps.append(c)
        if not logs:
            continue
        mean, low, high = log_interval(logs, confidence)
        if censored:     # the mean is a lower bound: an interval around it would mislead
            low = high = math.nan
        rows.append({"target": t, "seeds": len(logs), "censored": censored,
                     "baseline_steps": float(np.mean(b_steps)),
                     "candidate_steps": float(np.mean(c_steps)), "multiplier": mean,
                     "lower": low, "upper": high,
                     "per_seed": [math.exp(v) for v in logs]})
    return rows


def end_multiplier(base: Mapping[int, Curve], cand: Mapping[int, Curve],
                   confidence: float = 0.95) -> dict[str, Any] | None:
    """At the end of the candidate's curve: its last evaluated step over the steps the
    baseline needs to reach the candidate's loss there (paired by seed). A baseline that never
    gets there (the candidate is ahead) counts its last step: the multiplier is then an upper
    bound (``censored``)."""
    seeds = sorted(set(base) & set(cand))
    logs, censored = [], 0
    for s in seeds:
        steps, losses = cand[s]
        b = crossing(*base[s], losses[-1])
        if b is None:
            censored += 1
            b = float(base[s][0][-1])
        logs.append(math.log(steps[-1] / b))
    if not logs:
        return None
    mean, low, high = log_interval(logs, confidence)
    return {"seeds": len(logs), "censored": censored,
            "candidate_steps": float(cand[seeds[0]][0][-1]),
            "multiplier": mean, "lower": low, "upper": high,
            "per_seed": [math.exp(v) for v in logs]}


def final_loss_multiplier(base: Mapping[int, Curve], finals: Mapping[int, tuple[int, float]],
                          confidence: float = 0.95) -> dict[str, Any] | None:
    """For each seed, a candidate's final loss after its whole run (``finals``: seed -> (steps,
    loss), its lr decay included) against the baseline's curve at constant lr: the candidate's
    steps over the steps that curve needs to reach that loss. A decay would only bring the
    baseline there sooner, so this is a **lower bound** on the multiplier of two decayed runs
    (as long as a shorter decayed run of the candidate ends higher than its whole run).
    None when the baseline's curve reaches the loss in no seed; seeds where it never gets there
    are left out and counted (``unreached``)."""
    logs, unreached, steps = [], 0, []
    for seed in sorted(set(base) & set(finals)):
        n, loss = finals[seed]
        b = crossing(*base[seed], loss)
        if b is None:
            unreached += 1
            continue
        logs.append(math.log(n / b))
        steps.append(b)
    if not logs:
        return None
    mean, low, high = log_interval(logs, confidence)
    return {"seeds": len(logs), "unreached": unreached, "baseline_steps": float(np.mean(steps)),
            "multiplier": mean, "lower": low, "upper": high,
            "per_seed": [math.exp(v) for v in logs]}


def multiplier_table(curves: Mapping[str, Mapping[int, Curve]], baseline: str, floor: float,
                     n_targets: int = 8, confidence: float = 0.95) -> pd.DataFrame:
    """Every run of ``curves`` (run name -> seed -> curve) but ``baseline`` against it, at
    :func:`targets_between` the ``floor`` and the baseline's final loss."""
    base = curves.get(baseline)
    if not base:
        return pd.DataFrame()
    targets = targets_between(floor, max(float(c[1][-1]) for c in base.values()), n_targets)
    rows = []
    for name in sorted(curves):
        if name == baseline:
            continue
        for r in multiplier_rows(base, curves[name], targets, confidence):
            rows.append({"candidate": name, "baseline": baseline, **r})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------
# final loss against training length: the multiplier at equal final loss
# ------------------------------------------------------------------------------------------------
def steps_at_final_loss(steps: Sequence[int], losses: Sequence[float], target: float
                        ) -> float | None:
    """The training length at which a final-loss curve (each point a whole run's final loss, its
    decay included, against its total steps, increasing) reaches ``target``: linearly
    interpolated in log(steps) between the two runs around the first crossing. None when the
    target lies outside the curve: above its shortest run's loss or below every loss it reaches
    (not measured: never extrapolated)."""
    if not len(losses) or target > losses[0]:
        return None
    return crossing(steps, losses, target)


def equal_final_loss_rows(base: Mapping[int, Curve], cand: Mapping[int, Curve],
                          confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per training length of the candidate's final-loss curves (``cand``: seed -> (total
    steps, final losses), the same lengths in every seed), paired by seed with the baseline's
    (``base``): the steps the baseline's curve needs for the candidate's final loss
    (:func:`steps_at_final_loss`), and the multiplier ``candidate steps / baseline steps`` with
    its t interval over the seeds (:func:`log_interval`). A length whose final loss lies
    outside the baseline's curve in any seed is ``measured: False`` (``outside`` counts those
    seeds) and has no multiplier: a mean over the seeds that happen to fall inside would be
    chosen by the outcome."""
    seeds = sorted(set(base) & set(cand))
    if not seeds:
        return []
    lengths = [int(n) for n in cand[seeds[0]][0]]
    for s in seeds:
        if [int(n) for n in cand[s][0]] != lengths:
            raise ValueError(f"seed {s}'s final-loss curve has lengths {list(cand[s][0])}, "
                             f"seed {seeds[0]}'s {lengths}: every seed needs the same lengths")
    rows = []
    for i, n in enumerate(lengths):
        finals = [float(cand[s][1][i]) for s in seeds]
        found = [steps_at_final_loss(*base[s], y) for s, y in zip(seeds, finals)]
        logs = [math.log(n / b) for b in found if b is not None]
        outside = sum(b is None for b in found)
        row: dict[str, Any] = {"candidate_steps": n, "candidate_final": float(np.mean(finals)),
                               "seeds": len(seeds), "outside": outside, "measured": not outside,
                               "baseline_steps": math.nan, "multiplier": math.nan,
                               "lower": math.nan, "upper": math.nan,
                               "per_seed": [math.exp(v) for v in logs]}
        if not outside:
            mean, low, high = log_interval(logs, confidence)
            row.update(baseline_steps=float(np.mean([b for b in found if b is not None])),
                       multiplier=mean, lower=low, upper=high)
        rows.append(row)
    return rows
