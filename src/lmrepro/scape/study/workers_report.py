"""The analysis of the worker-count study (:mod:`lmrepro.scape.study.workers`).

From the study's stage directory it writes, under ``out_dir``:

* ``runs.csv``: every verdict run (W, seed, run, lr, test and validation bits per byte) with
  what its ``metrics.jsonl`` says over the steps at the target sparsity: bytes each worker hands
  to the step's collectives by kind, the bytes it puts on the wire and takes off it (ring
  collectives, :func:`wire_bytes`), the coordinates whose synced gradient is non-zero (top-k: the
  union of the workers' masks), top-k's pairwise mask overlap and SCAPE's mask agreement with
  the averaged view (:mod:`lmrepro.scape.train.simulated`);
* ``gaps.csv``: at each W, each method against dense AdamS on the same seeds (test split): the
  mean relative gap in bits per byte with one-sided Student t bounds over seeds (df = seeds - 1),
  the two-sided t test's p-value, Holm's adjusted p over every contrast of the study, and the
  Bonferroni bounds (the intervals that hold for all contrasts at once);
* ``pairs.csv``: top-k against SCAPE at the same sparsity at each W (same seeds), and how that
  difference moves from the smallest W to each larger one (a difference of differences);
* ``comm.csv``: per W and method, the mean bytes and coordinates above (one row each);
* ``sweep.csv``: every sweep run, the winners, whether each is interior to what was tried and
  whether the validation and test splits agree on it;
* ``gap_vs_workers.png`` and ``bytes_vs_workers.png``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from lmrepro.io import atomic_write_text, read_json, read_jsonl
from lmrepro.model import ByteTransformer, ModelConfig
from lmrepro.results import SUMMARY
from lmrepro.pipeline.length_study import mean_bpb, paired_test
from lmrepro.pipeline.runs import Run, load_run
from lmrepro.stats import StatsConfig, t_bounds

BASELINE = "adams"
#: the study's verdicts in one line (lmrepro.pipeline.pages reads it for a publication's row)
VERDICTS = "verdicts.txt"
#: the collective each kind of bytes travels in, per optimizer (SCAPE and the dense baselines
#: all-reduce their values; top-k all-gathers values and indices; SCAPE all-gathers its mask)
COLLECTIVE = {("scape", "grad_values"): "all_reduce", ("scape", "mask"): "all_gather",
              ("topk", "grad_values"): "all_gather", ("topk", "mask"): "all_gather",
              ("adams", "grad_values"): "all_reduce", ("adamw", "grad_values"): "all_reduce"}


def wire_bytes(optimizer: str, hand_in: dict[str, float], workers: int) -> float:
    """Bytes one worker sends (and, the rings being symmetric, receives) per step: a ring
    all-reduce moves ``2 (W - 1) / W`` of what a worker hands in, a ring all-gather ``W - 1``
    times it (every other worker's part passes through)."""
    total = 0.0
    for kind, b in hand_in.items():
        if kind == "total" or not b:
            continue
        how = COLLECTIVE.get((optimizer, kind), "all_reduce")
        total += b * (2 * (workers - 1) / workers if how == "all_reduce" else workers - 1)
    return total


def eligible_coordinates(model: ModelConfig) -> tuple[int, int]:
    """``(all, top-k tensors')`` coordinate counts of ``model`` (1-D tensors are sent whole)."""
    m = ByteTransformer(model)
    n = sum(p.numel() for p in m.parameters())
    return n, n - sum(p.numel() for p in m.parameters() if p.dim() <= 1)


def run_diagnostics(run_dir: Path, target_from: int) -> dict[str, float]:
    """Means over the steps from ``target_from`` (the sparsity at its target) of a run's logged
    bytes by kind, sparsity and the simulated workers' probes."""
    recs = [r for r in read_jsonl(run_dir / "metrics.jsonl")
            if "loss" in r and r["step"] >= target_from]
    out: dict[str, float] = {}
    for key in ("bytes_grad_values", "bytes_mask", "sparsity", "union_sent", "pair_overlap",
                "mask_agreement"):
        vals = [float(r[key]) for r in recs if key in r]
        if vals:
            out[key] = float(np.mean(vals))
    return out


def load_runs(stage_dir: str | Path) -> pd.DataFrame:
    """One row per finished verdict run of the study (see the module docstring)."""
    rows = []
    counts: dict[str, tuple[int, int]] = {}     # one model built per model, not per run
    for summary in sorted(Path(stage_dir).glob(f"runs/W*/seed*/*/{SUMMARY}")):
        run_dir = summary.parent
        s, job = read_json(summary), read_json(run_dir / "job.json")
        settings, run = job["settings"], job["run"]
        workers = int(job["workers"])
        key = json.dumps(job["model"], sort_keys=True)
        if key not in counts:
            counts[key] = eligible_coordinates(ModelConfig(**job["model"]))
        n, eligible = counts[key]
        diag = run_diagnostics(run_dir, int(settings["sparsity_warmup_steps"]))
        hand_in = {"grad_values": diag.get("bytes_grad_values", 0.0),
                   "mask": diag.get("bytes_mask", 0.0)}
        opt = run["optimizer"]
        sparsity = diag.get("sparsity", 0.0)
        rows.append({
            "workers": workers, "seed": int(job["seed"]), "run": s["name"], "optimizer": opt,
            "path": str(run_dir), "steps": int(settings["steps"]),
            "lr": float(run["lr"]), "test_bpb": (s.get("details") or {}).get("final_test_bpb"),
            "val_bpb": s.get("final_bpb"), "diverged_at_step": s.get("diverged_at_step"),
            "hand_in_bytes": hand_in["grad_values"] + hand_in["mask"],
            "wire_bytes": wire_bytes(opt, hand_in, workers),
            "coords_sent_per_worker": n * (1.0 - sparsity),
            "coords_moved_by_sync": (diag["union_sent"] + (n - eligible) if "union_sent" in diag
                                     else n * (1.0 - sparsity)),
            "n_params": n, "n_topk_coords": eligible,
            "pair_overlap": diag.get("pair_overlap"), "mask_agreement": diag.get("mask_agreement"),
        })
    return pd.DataFrame(rows)


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given."""
    order = np.argsort(p)
    m = len(p)
    adj = np.empty(m)
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        adj[j] = running
    return adj.tolist()


def _runs_by_name(at: pd.DataFrame) -> dict[str, list[Run]]:
    return {name: [load_run(p, p) for p in g.path] for name, g in at.groupby("run")}


def t_row(d: Sequence[float], confidence: float, contrasts: int) -> dict[str, Any]:
    """The two-sided t test's p of per-seed differences ``d`` and their Bonferroni bounds over
    ``contrasts`` (one-sided, as the raw bounds)."""
    if len(d) < 2:
        return {"p_two_sided": math.nan}
    blo, bhi = t_bounds(d, 1.0 - (1.0 - confidence) / max(contrasts, 1))
    sd = float(np.std(d, ddof=1))
    p = (1.0 if sd == 0 else
         float(2 * sps.t.sf(abs(np.mean(d)) / (sd / math.sqrt(len(d))), len(d) - 1)))
    return {"p_two_sided": p, "bonferroni_lower_pct": 100 * blo,
            "bonferroni_upper_pct": 100 * bhi}


def _test(base: list[Run], cand: list[Run], stats: StatsConfig) -> dict[str, Any]:
    """The package's seed-level paired test (:func:`lmrepro.pipeline.length_study.paired_test`:
    per seed the mean relative difference over the test batches, then t bounds over seeds),
    in percent."""
    r = paired_test(base, cand, stats)
    out = {"seeds": r["seeds"], "diverged": r.get("diverged", 0), "verdict": r.get("verdict"),
           "per_seed": r.get("per_seed", []), "per_seed_ids": r.get("per_seed_ids", [])}
    for key in ("mean", "lower", "upper"):
        out[{"mean": "gap_pct"}.get(key, f"{key}_pct")] = (
            100 * r[key] if r.get(key) is not None else math.nan)
    return out


def gap_table(runs: pd.DataFrame, stats: StatsConfig, floor: float | None = None
              ) -> pd.DataFrame:
    """Every method against dense AdamS at each W (see the module docstring); ``testable``:
    dense AdamS ends 10 % below the corpus's trigram floor ``floor`` (test split)."""
    from lmrepro.data.ngram import testable

    rows = []
    for w in sorted(runs.workers.unique()):
        by = _runs_by_name(runs[runs.workers == w])
        base = by.get(BASELINE, [])
        bpb = mean_bpb(base) if base else math.nan
        for name in sorted(n for n in by if n != BASELINE):
            rows.append({"workers": int(w), "run": name, **_test(base, by[name], stats),
                         "baseline_test_bpb": bpb, "trigram_floor": floor,
                         "testable": True if floor is None else testable(bpb, floor)})
    out = pd.DataFrame(rows)
    extra = [t_row(r.per_seed, stats.confidence, len(out)) for r in out.itertuples()]
    out = pd.concat([out, pd.DataFrame(extra)], axis=1)
    ok = out.p_two_sided.notna()
    out.loc[ok, "p_holm"] = holm(out.loc[ok, "p_two_sided"].tolist())
    return out


def _change_rows(runs: pd.DataFrame, base: str, cand: str, stats: StatsConfig
                 ) -> list[dict[str, Any]]:
    """``cand`` against ``base`` at each W (the paired test), then the change of that
    difference from the smallest W to each larger one (per seed, t bounds over seeds)."""
    rows, per_w = [], {}
    ws = sorted(runs.workers.unique())
    for w in ws:
        by = _runs_by_name(runs[runs.workers == w])
        r = _test(by[base], by[cand], stats)
        per_w[w] = dict(zip(r["per_seed_ids"], r["per_seed"]))
        rows.append({"contrast": f"{cand} vs {base}", "workers": int(w), **r,
                     **t_row(r["per_seed"], stats.confidence, 1)})
    for w in ws[1:]:
        seeds = sorted(set(per_w[ws[0]]) & set(per_w[w]))
        dd = [per_w[w][s] - per_w[ws[0]][s] for s in seeds]
        lo, hi = t_bounds(dd, stats.confidence) if len(dd) >= 2 else (math.nan, math.nan)
        rows.append({"contrast": f"change of ({cand} vs {base}) from W={ws[0]}",
                     "workers": int(w), "seeds": len(dd), "per_seed": dd,
                     "per_seed_ids": seeds, "gap_pct": 100 * float(np.mean(dd)) if dd else math.nan,
                     "lower_pct": 100 * lo, "upper_pct": 100 * hi,
                     **t_row(dd, stats.confidence, 1)})
    return rows


def pair_table(runs: pd.DataFrame, stats: StatsConfig) -> pd.DataFrame:
    """Top-k against SCAPE at the same sparsity per W, and each sparse method's gap to dense
    AdamS, with the change of each from the smallest W (:func:`_change_rows`): does SCAPE's one
    mask pay off against top-k as W grows, and does the owner's narrowing view cost SCAPE?"""
    rows: list[dict[str, Any]] = []
    names = set(runs.run)
    for sp in ("90", "99"):
        topk, scape = f"topk{sp}", f"scape{sp}"
        if {topk, scape} <= names:
            rows += _change_rows(runs, scape, topk, stats)
    if BASELINE in names:
        for cand in sorted(n for n in names if n != BASELINE):
            rows += [r for r in _change_rows(runs, BASELINE, cand, stats)
                     if r["contrast"].startswith("change")]
    return pd.DataFrame(rows)


def comm_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean bytes and coordinates per W and method (over seeds)."""
    cols = ["hand_in_bytes", "wire_bytes", "coords_sent_per_worker", "coords_moved_by_sync",
            "pair_overlap", "mask_agreement", "n_params"]
    frame = runs[["workers", "run"]].join(runs[cols].apply(pd.to_numeric, errors="coerce"))
    out = frame.groupby(["workers", "run"], as_index=False)[cols].mean()
    out["moved_fraction"] = out.coords_moved_by_sync / out.n_params
    return out


def sweep_table(stage_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The sweep's runs and its winners (``sweep/sweep.json``)."""
    record = read_json(Path(stage_dir) / "sweep" / "sweep.json")
    return pd.DataFrame(record["rows"]).assign(seed=record["seed"]), record["winners"]


def write_analysis(stage_dir: str | Path, out_dir: str | Path, stats: StatsConfig,
                   floor: float | None = None) -> dict[str, pd.DataFrame]:
    """Every table and figure of the module docstring into ``out_dir``; returns the tables."""
    from lmrepro.scape.study.workers_plots import plot_bytes, plot_gaps

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(stage_dir)
    sweep, winners = sweep_table(stage_dir)
    tables = {"runs": runs, "gaps": gap_table(runs, stats, floor),
              "pairs": pair_table(runs, stats),
              "comm": comm_table(runs), "sweep": sweep,
              "winners": pd.DataFrame([{"point": k, **v} for k, v in winners.items()])}
    for name, frame in tables.items():
        frame.drop(columns=["path"], errors="ignore").to_csv(out / f"{name}.csv", index=False)
    atomic_write_text(out / VERDICTS, verdicts_line(tables["gaps"], runs))
    plot_gaps(tables["gaps"], out / "gap_vs_workers.png")
    plot_bytes(tables["comm"], tables["gaps"], out / "bytes_vs_workers.png")
    return tables


def verdicts_line(gaps: pd.DataFrame, runs: pd.DataFrame) -> str:
    """The study's verdicts in one line (a publication's row in the README): each method
    against dense AdamS at the largest W, with its bounds and the package's verdict."""
    w = int(gaps.workers.max())
    at = gaps[gaps.workers == w]
    steps = int(runs.steps.iloc[0])
    return (f"{steps} steps, W = {w}, vs {BASELINE}: "
            + "; ".join(f"{r.run} {_pct(r.gap_pct)} [{r.lower_pct:+.2f}, {r.upper_pct:+.2f}] "
                        f"{r.verdict}" + ("" if r.testable else " (not testable)")
                        for r in at.itertuples()) + "\n")


def _share(x: Any) -> str:
    return "" if x is None or pd.isna(x) else f"{float(x):.2f}"


def _pct(x: Any) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:+.2f} %"


def section_markdown(tables: dict[str, pd.DataFrame], where: str) -> str:
    """The study's section (the README of its publication, docs/scape.md): every figure from
    ``tables`` (:func:`write_analysis`'s, or the same files read back)."""
    gaps, comm, pairs = tables["gaps"], tables["comm"], tables["pairs"]
    winners, runs = tables["winners"], tables["runs"]
    seeds = sorted(runs.seed.unique()) if len(runs) else []
    lines = ["### More workers: SCAPE and top-k from W = "
             + ", ".join(str(w) for w in sorted(runs.workers.unique())) + " workers", "",
             f"Tables in `{where}`. Global batch and tokens fixed (each worker 1/W of the batch), "
             f"seeds {', '.join(str(s) for s in seeds)}, test split; gaps to dense AdamS by the "
             "package's paired test (per seed the mean relative difference over the test "
             "batches; one-sided 95 % t bounds over seeds; verdict at a 1 % margin), "
             "Holm-adjusted p over the study's contrasts and Bonferroni bounds (all contrasts "
             "at once). Workers simulated in one process "
             "(the torchrun path's numbers; no timing is a result).", "",
             "| W | method | gap [L, U] | verdict | p (Holm) | Bonferroni [L, U] | bytes sent "
             "per worker per step | coordinates with a synced gradient | top-k mask overlap | "
             "SCAPE mask agreement |", "|---:|---|---|---|---:|---|---:|---:|---:|---:|"]
    both = gaps.merge(comm, on=["workers", "run"], how="left")
    for r in both.itertuples():
        lines.append(
            f"| {r.workers} | {r.run} | {_pct(r.gap_pct)} [{_pct(r.lower_pct)}, "
            f"{_pct(r.upper_pct)}] | {r.verdict} | {r.p_two_sided:.2g} ({r.p_holm:.2g}) | "
            f"[{_pct(r.bonferroni_lower_pct)}, {_pct(r.bonferroni_upper_pct)}] | "
            f"{r.wire_bytes / 1e3:.1f} kB | {100 * r.moved_fraction:.1f} % | "
            + _share(getattr(r, "pair_overlap", None)) + " | "
            + _share(getattr(r, "mask_agreement", None)) + " |")
    dense = comm[comm.run == BASELINE].set_index("workers")["wire_bytes"]
    lines += ["", "Dense AdamS sends " + ", ".join(f"{dense[w] / 1e3:.0f} kB at W = {w}"
                                                   for w in dense.index) + " per worker per step.",
              "", "Top-k against SCAPE at the same sparsity (test split, paired by seed), and "
              "how that difference and each method's gap to dense AdamS move with W (per seed, "
              "t bounds over seeds):", "", "| contrast | W | difference [L, U] | p |",
              "|---|---:|---|---:|"]
    for r in pairs.itertuples():
        lines.append(f"| {r.contrast} | {r.workers} | {_pct(r.gap_pct)} [{_pct(r.lower_pct)}, "
                     f"{_pct(r.upper_pct)}] | {r.p_two_sided:.2g} |")
    lines += ["", "Learning rates (bracketed on held-out seed "
              f"{int(tables['sweep'].seed.iloc[0])}, validation split; an edge winner "
              "extended before the verdict runs):", "",
              "| swept at | lr | interior | test split's winner |", "|---|---:|---|---|"]
    for r in winners.itertuples():
        lines.append(f"| {r.point} | {r.lr:g} | {'yes' if r.interior else 'NO (edge)'} | "
                     + ("the same" if r.agree else f"{r.test_winner:g} (splits disagree)")
                     + " |")
    return "\n".join(lines) + "\n"


def read_tables(out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables :func:`write_analysis` wrote, read back (what a publication holds)."""
    return {name: pd.read_csv(Path(out_dir) / f"{name}.csv")
            for name in ("runs", "gaps", "pairs", "comm", "sweep", "winners")}
