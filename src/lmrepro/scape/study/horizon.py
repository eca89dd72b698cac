"""Steps to target in SCAPE's training-length study: the loss curves each run records along its
stable phase (``scape.scaling.curve_points`` under a ``wsd`` schedule) read as compute
multipliers against dense AdamS (:mod:`lmrepro.pipeline.steps_to_target`), and the figures
that show them; with decay branches (``scape.scaling.branches``,
:mod:`lmrepro.scape.study.branches`), each run's final loss against its training length and the
multiplier at equal final loss, the study's headline where branches exist."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from lmrepro.pipeline.runs import load_run
from lmrepro.pipeline.steps_to_target import (Curve, end_multiplier, equal_final_loss_rows,
                                              final_loss_multiplier, multiplier_table)

BASELINE = "adams"


def run_curve(path: str, split: str = "test") -> Curve | None:
    """The evaluations a run logged during training (``eval_at``; not the final model's, which
    a wsd run scores after its decay): step counts and bits/byte on ``split``."""
    key = "test_bpb" if split == "test" else "eval_bpb"
    recs = [r for r in load_run(path, path).metrics if key in r and "test_bpb" in r]
    if not recs:
        return None
    return [int(r["step"]) + 1 for r in recs], [float(r[key]) for r in recs]


def point_curves(runs: pd.DataFrame, split: str = "test"
                 ) -> dict[tuple[str, int], dict[str, dict[int, Curve]]]:
    """Per (size, steps) point of the study's runs: run name -> seed -> curve (runs that
    logged one)."""
    out: dict[tuple[str, int], dict[str, dict[int, Curve]]] = {}
    for rec in runs[runs.kind == "runs"].itertuples():
        curve = run_curve(rec.path, split)
        if curve is not None:
            out.setdefault((rec.size, int(rec.steps)), {}).setdefault(rec.run, {})[
                int(rec.seed)] = curve
    return out


def multiplier_tables(runs: pd.DataFrame, floor: Mapping[str, Any] | None,
                      n_targets: int = 8) -> dict[str, pd.DataFrame]:
    """Per point with curves, each run against dense AdamS: ``multiplier`` at targets from the
    corpus's bigram floor (test split) down to AdamS's loss at the end of its stable phase;
    ``end_multiplier`` at the end of each candidate's stable phase; ``final_multiplier``: each
    candidate's final loss (its decay included) on AdamS's constant-lr curve, a lower bound
    (:func:`lmrepro.pipeline.steps_to_target.final_loss_multiplier`)."""
    out: dict[str, list[Any]] = {"multiplier": [], "end_multiplier": [], "final_multiplier": []}
    if floor is None:
        return {k: pd.DataFrame() for k in out}
    bigram = float(floor["bigram"]["test"])
    main = runs[runs.kind == "runs"]
    for (size, steps), curves in sorted(point_curves(runs).items()):
        if BASELINE not in curves:
            continue
        t = multiplier_table(curves, BASELINE, bigram, n_targets)
        if len(t):
            out["multiplier"].append(t.assign(size=size, steps=steps))
        point = main[(main["size"] == size) & (main.steps == steps)]
        key = {"size": size, "steps": steps, "baseline": BASELINE}
        for name in sorted(curves):
            if name == BASELINE:
                continue
            e = end_multiplier(curves[BASELINE], curves[name])
            if e is not None:
                out["end_multiplier"].append({**key, "candidate": name, **e})
            finals = {int(r.seed): (int(r.steps), float(r.test_bpb))
                      for r in point[point.run == name].itertuples() if r.test_bpb is not None}
            if not finals:
                continue
            f = final_loss_multiplier(curves[BASELINE], finals) or {
                "seeds": 0, "unreached": len(finals), "baseline_steps": np.nan,
                "multiplier": np.nan, "lower": np.nan, "upper": np.nan, "per_seed": []}
            out["final_multiplier"].append({
                **key, "candidate": name, "candidate_steps": steps,
                "candidate_final_test_bpb": float(np.mean([v[1] for v in finals.values()])), **f})
    first = ["size", "steps", "candidate", "baseline"]
    tables = {k: pd.DataFrame(out[k]) for k in ("end_multiplier", "final_multiplier")}
    multiplier = pd.concat(out["multiplier"], ignore_index=True) if out["multiplier"] \
        else pd.DataFrame()
    if len(multiplier):
        multiplier = multiplier[first + [c for c in multiplier.columns if c not in first]]
    return {"multiplier": multiplier, **tables}


def multiplier_figure(multiplier: pd.DataFrame, floor: Mapping[str, Any] | None,
                      colours: Mapping[str, str]) -> Figure:
    """The compute multiplier against the target loss per method (95 % t interval over seeds),
    the bigram and trigram floors marked; lower losses to the right."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    for name, g in multiplier.groupby("candidate", sort=True):
        g = g.sort_values("target")
        col = colours.get(name)
        ax.plot(g.target, g.multiplier, "o-", color=col, label=f"{name} / dense AdamS")
        ok = g.lower.notna()
        ax.fill_between(g.target[ok], g.lower[ok], g.upper[ok], color=col, alpha=0.2)
        cens = g[g.censored > 0]
        if len(cens):
            ax.plot(cens.target, cens.multiplier, "^", color=col, ms=9,
                    label=f"{name}: not reached by every seed (a lower bound)")
    if floor is not None:
        for k, ls in (("bigram", "--"), ("trigram", ":")):
            ax.axvline(float(floor[k]["test"]), color="gray", ls=ls,
                       label=f"{k} floor (test) {float(floor[k]['test']):.3f}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.invert_xaxis()
    ax.set_yscale("log")
    times = FuncFormatter(lambda y, _: f"{y:g}x")
    ax.yaxis.set_major_formatter(times)
    ax.yaxis.set_minor_formatter(times)
    ax.set_xlabel("target loss, test bits/byte (lower to the right)")
    ax.set_ylabel("steps needed / dense AdamS's steps")
    ax.set_title("Steps to target: how many times dense AdamS's steps each method needs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def curves_figure(curves: Mapping[str, Mapping[int, Curve]], floor: Mapping[str, Any] | None,
                  colours: Mapping[str, str], title: str) -> Figure:
    """Test bits/byte along the stable phase of every run (one line per seed, log steps), the
    n-gram floors marked."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    for name in sorted(curves):
        for i, (_seed, (steps, losses)) in enumerate(sorted(curves[name].items())):
            ax.plot(steps, losses, "o-", ms=3, color=colours.get(name), alpha=0.8,
                    label=name if i == 0 else None)
    if floor is not None:
        for k, ls in (("bigram", "--"), ("trigram", ":")):
            ax.axhline(float(floor[k]["test"]), color="gray", ls=ls, label=f"{k} floor (test)")
    ax.set_xscale("log")
    ax.set_xlabel("optimizer steps (stable phase of the wsd schedule)")
    ax.set_ylabel("test bits/byte")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def describe(multiplier: pd.DataFrame, ends: pd.DataFrame, finals: pd.DataFrame
             ) -> list[str]:
    """Sentences computed from the tables: per candidate the multiplier at the first and last
    target, at the end of its stable phase, and for its final loss."""
    out = []
    for name, g in multiplier.groupby("candidate", sort=True) if len(multiplier) else []:
        g = g.sort_values("target", ascending=False)
        a, b = g.iloc[0], g.iloc[-1]
        last = (f"at least {b.multiplier:.2f}x (a lower bound: {b.censored} of {b.seeds} seeds "
                "never got there at constant lr)" if b.censored else
                f"{b.multiplier:.2f}x [{_num(b.lower)}, {_num(b.upper)}]")
        out.append(f"{name} needs {a.multiplier:.2f}x [{_num(a.lower)}, {_num(a.upper)}] dense "
                   f"AdamS's steps to reach {a.target:.3f} test bits/byte (the bigram floor: "
                   f"leaving the plateau) and {last} to reach {b.target:.3f}, AdamS's loss at "
                   "the end of its stable phase.")
    for r in ends.itertuples() if len(ends) else []:
        bound = (f"; dense AdamS did not reach it in {r.censored} of the seeds, so this is an "
                 "upper bound" if r.censored else "")
        out.append(f"At the end of its stable phase ({r.candidate_steps:.0f} steps) {r.candidate}"
                   f" has used {r.multiplier:.2f}x [{_num(r.lower)}, {_num(r.upper)}] the steps "
                   f"dense AdamS needs to reach the same test loss ({r.seeds} seeds{bound}).")
    for r in finals.itertuples() if len(finals) else []:
        out.append(final_text(r))
    return out


def final_text(r: Any) -> str:
    """One row of ``final_multiplier`` in words (the claims' caveat says the same)."""
    missing = (f"; in {r.unreached} seed(s) AdamS's constant-lr curve never reaches it"
               if r.unreached else "")
    if not r.seeds:
        return (f"{r.candidate}'s final test loss after {r.candidate_steps} steps with its decay "
                f"({r.candidate_final_test_bpb:.3f} bits/byte) is below every loss dense AdamS "
                "reaches at constant lr in its stable phase: no multiplier (the final gap "
                "compares the two decayed runs)")
    return (f"{r.candidate}'s final test loss after {r.candidate_steps} steps with its decay "
            f"({r.candidate_final_test_bpb:.3f} bits/byte) is reached by dense AdamS at constant "
            f"lr, without a decay, after {r.baseline_steps:.0f} steps: {r.candidate} needs at "
            f"least {r.multiplier:.2f}x [{_num(r.lower)}, {_num(r.upper)}] AdamS's steps for "
            f"that loss (a lower bound: a decay only brings AdamS there sooner; {r.seeds} "
            f"seeds{missing}).")


def final_short(r: Any) -> str:
    """One row of ``final_multiplier`` in a few words, for the claims' measured text."""
    if not r.seeds:
        return ("not measurable: its final loss, after its decay, is below every loss dense "
                "AdamS reaches at constant lr")
    return (f">= {r.multiplier:.2f}x [{_num(r.lower)}, {_num(r.upper)}] dense AdamS's steps "
            f"for the same loss ({r.seeds} seeds)")


def _num(x: Any) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.2f}"


# ------------------------------------------------------------------------------------------------
# decay branches: final loss against training length (lmrepro.scape.study.branches)
# ------------------------------------------------------------------------------------------------
def final_curves(branches: pd.DataFrame) -> dict[str, dict[str, dict[int, Curve]]]:
    """Per model size: run name -> seed -> (total steps, final test bits/byte) of its decay
    branches (rows of ``branches/`` as :func:`lmrepro.scape.study.report.study_runs` reads
    them), on the lengths every seed of the run has (an interrupted study compares like with
    like)."""
    out: dict[str, dict[str, dict[int, Curve]]] = {}
    done = branches[branches.test_bpb.notna()] if len(branches) else branches
    for (size, name), g in done.groupby(["size", "run"], sort=True) if len(done) else []:
        by_seed = {int(seed): dict(zip(s.steps.astype(int), s.test_bpb.astype(float)))
                   for seed, s in g.groupby("seed")}
        common = sorted(set.intersection(*(set(v) for v in by_seed.values())))
        if common:
            out.setdefault(size, {})[name] = {
                seed: (common, [v[n] for n in common]) for seed, v in sorted(by_seed.items())}
    return out


def equal_final_table(branches: pd.DataFrame) -> pd.DataFrame:
    """Per size, candidate and training length: the multiplier at equal final loss against
    dense AdamS's final-loss curve (:func:`lmrepro.pipeline.steps_to_target.equal_final_loss_rows`:
    interpolated per seed in log steps, a t interval over seeds, 'not measured' outside
    AdamS's curve)."""
    rows = []
    for size, curves in final_curves(branches).items():
        if BASELINE not in curves:
            continue
        for name in sorted(curves):
            if name != BASELINE:
                rows += [{"size": size, "candidate": name, "baseline": BASELINE, **r}
                         for r in equal_final_loss_rows(curves[BASELINE], curves[name])]
    return pd.DataFrame(rows)


def equal_final_headline(table: pd.DataFrame) -> pd.DataFrame:
    """Per size and candidate, the row of its longest training length: the headline."""
    if not len(table):
        return table
    return table.sort_values("candidate_steps").groupby(["size", "candidate"]).tail(1) \
        .reset_index(drop=True)


def equal_final_text(r: Any) -> str:
    """One row of :func:`equal_final_table` in words."""
    if not r.measured:
        return (f"{r.candidate}'s final test loss after {r.candidate_steps} steps with its decay "
                f"({r.candidate_final:.3f} bits/byte) lies outside dense AdamS's final-loss "
                f"curve in {r.outside} of {r.seeds} seeds: not measured (not extrapolated)")
    return (f"{r.candidate} reaches after {r.candidate_steps} steps with its decay the final test "
            f"loss ({r.candidate_final:.3f} bits/byte) that dense AdamS reaches, with its own "
            f"decay, after {r.baseline_steps:.0f} steps: {r.multiplier:.2f}x "
            f"[{_num(r.lower)}, {_num(r.upper)}] AdamS's steps ({r.seeds} seeds, decay "
            "branches, 95 % t interval)")


def equal_final_short(r: Any) -> str:
    """One row of :func:`equal_final_table` in a few words (the claims' measured text)."""
    if not r.measured:
        return "not measured: its final loss lies outside dense AdamS's final-loss curve"
    return (f"{r.multiplier:.2f}x [{_num(r.lower)}, {_num(r.upper)}] dense AdamS's steps for the "
            f"same final loss ({r.seeds} seeds, decay branches)")


def final_curves_figure(curves: Mapping[str, Mapping[int, Curve]], table: pd.DataFrame,
                        colours: Mapping[str, str], title: str) -> Figure:
    """Left: final test loss against training length (each decay branch; a line per seed);
    right: the multiplier at equal final loss against dense AdamS with its interval, the
    lengths not measured marked on the 1x line."""
    fig = Figure(figsize=(11, 4.5))
    left, right = fig.subplots(1, 2)
    for name in sorted(curves):
        for i, (_seed, (steps, losses)) in enumerate(sorted(curves[name].items())):
            left.plot(steps, losses, "o-", ms=3, color=colours.get(name), alpha=0.8,
                      label=name if i == 0 else None)
    left.set_xscale("log")
    left.set_xlabel("training length, steps (stable phase + a decay of 10 % of it)")
    left.set_ylabel("final test bits/byte")
    left.set_title(title)
    for name, g in table.groupby("candidate", sort=True) if len(table) else []:
        col = colours.get(name)
        m = g[g.measured]
        right.plot(m.candidate_steps, m.multiplier, "o-", color=col, label=f"{name} / dense AdamS")
        right.fill_between(m.candidate_steps, m.lower, m.upper, color=col, alpha=0.2)
        out = g[~g.measured]
        if len(out):
            right.plot(out.candidate_steps, [1.0] * len(out), "x", color=col, ms=9,
                       label=f"{name}: not measured (outside AdamS's curve)")
    right.axhline(1.0, color="black", lw=0.8)
    right.set_xscale("log")
    right.set_xlabel("the candidate's training length, steps")
    right.set_ylabel("steps / dense AdamS's steps for the same final loss")
    right.set_title("Multiplier at equal final loss (95 % t interval over seeds)")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def equal_final_lines(table: pd.DataFrame | None) -> list[str]:
    """The README's table of the multiplier at equal final loss (none without branches)."""
    if table is None or not len(table):
        return []
    lines = ["Multiplier at equal final loss (the headline; test split, 95 % t interval over "
             "seeds): each run's decay branches give its final loss against training length "
             "(a branch at s steps of the stable phase decays over round(0.1 s) more); per "
             "seed, dense AdamS's final-loss curve is interpolated in log steps at the "
             "candidate's final loss. A loss outside AdamS's curve in any seed is not "
             "measured (never extrapolated).", "",
             "| size | candidate | steps | final bits/byte | dense AdamS steps | multiplier | "
             "[low, high] | seeds | outside |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in table.itertuples():
        m = (f"{r.multiplier:.2f} | [{_num(r.lower)}, {_num(r.upper)}]" if r.measured
             else "not measured | ")
        base = f"{r.baseline_steps:.0f}" if r.measured else ""
        lines.append(f"| {r.size} | {r.candidate} | {r.candidate_steps} | "
                     f"{r.candidate_final:.3f} | {base} | {m} | {r.seeds} | {r.outside} |")
    return [*lines, ""]
