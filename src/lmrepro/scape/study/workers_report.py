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

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from lmrepro.io import read_json, read_jsonl
from lmrepro.model import ByteTransformer, ModelConfig
from lmrepro.results import SUMMARY
from lmrepro.stats import t_bounds

BASELINE = "adams"
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
    for summary in sorted(Path(stage_dir).glob(f"runs/W*/seed*/*/{SUMMARY}")):
        run_dir = summary.parent
        s, job = read_json(summary), read_json(run_dir / "job.json")
        settings, run = job["settings"], job["run"]
        workers = int(job["workers"])
        n, eligible = eligible_coordinates(ModelConfig(**job["model"]))
        diag = run_diagnostics(run_dir, int(settings["sparsity_warmup_steps"]))
        hand_in = {"grad_values": diag.get("bytes_grad_values", 0.0),
                   "mask": diag.get("bytes_mask", 0.0)}
        opt = run["optimizer"]
        sparsity = diag.get("sparsity", 0.0)
        rows.append({
            "workers": workers, "seed": int(job["seed"]), "run": s["name"], "optimizer": opt,
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


def paired_gap(base: pd.DataFrame, cand: pd.DataFrame) -> list[float]:
    """Per seed, ``cand / base - 1`` of the test bits per byte (seeds both have, finished)."""
    return _gaps_by_seed(base, cand)[1]


def _gaps_by_seed(base: pd.DataFrame, cand: pd.DataFrame) -> tuple[list[int], list[float]]:
    b = base.set_index("seed")["test_bpb"].dropna()
    c = cand.set_index("seed")["test_bpb"].dropna()
    seeds = sorted(set(b.index) & set(c.index))
    return seeds, [float(c[s] / b[s] - 1.0) for s in seeds]


def t_row(d: Sequence[float], confidence: float, contrasts: int) -> dict[str, Any]:
    """Mean, one-sided t bounds, two-sided p, and Bonferroni bounds over ``contrasts``."""
    if len(d) < 2:
        return {"seeds": len(d), "gap_pct": 100 * float(np.mean(d)) if d else math.nan}
    lo, hi = t_bounds(d, confidence)
    blo, bhi = t_bounds(d, 1.0 - (1.0 - confidence) / max(contrasts, 1))
    sd = float(np.std(d, ddof=1))
    p = (1.0 if sd == 0 else
         float(2 * sps.t.sf(abs(np.mean(d)) / (sd / math.sqrt(len(d))), len(d) - 1)))
    return {"seeds": len(d), "gap_pct": 100 * float(np.mean(d)), "lower_pct": 100 * lo,
            "upper_pct": 100 * hi, "p_two_sided": p, "bonferroni_lower_pct": 100 * blo,
            "bonferroni_upper_pct": 100 * bhi}


def gap_table(runs: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Every method against dense AdamS at each W (see the module docstring)."""
    pairs = [(w, r) for w in sorted(runs.workers.unique())
             for r in sorted(runs.run.unique()) if r != BASELINE]
    rows = []
    for w, r in pairs:
        at = runs[runs.workers == w]
        d = paired_gap(at[at.run == BASELINE], at[at.run == r])
        rows.append({"workers": w, "run": r, **t_row(d, confidence, len(pairs))})
    out = pd.DataFrame(rows)
    if "p_two_sided" in out:
        ok = out.p_two_sided.notna()
        out.loc[ok, "p_holm"] = holm(out.loc[ok, "p_two_sided"].tolist())
    return out


def pair_table(runs: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Top-k against SCAPE at the same sparsity per W, and the change of that difference from
    the smallest W to each larger one (per seed: a difference of differences)."""
    rows = []
    ws = sorted(runs.workers.unique())
    for sp in ("90", "99"):
        topk, scape = f"topk{sp}", f"scape{sp}"
        if not {topk, scape} <= set(runs.run):
            continue
        for w in ws:
            at = runs[runs.workers == w]
            d = paired_gap(at[at.run == scape], at[at.run == topk])
            rows.append({"contrast": f"{topk} vs {scape}", "workers": w,
                         **t_row(d, confidence, 1)})
        base = runs[runs.workers == ws[0]]
        for w in ws[1:]:
            at = runs[runs.workers == w]
            d0 = dict(zip(*_gaps_by_seed(base[base.run == scape], base[base.run == topk])))
            d1 = dict(zip(*_gaps_by_seed(at[at.run == scape], at[at.run == topk])))
            dd = [d1[s] - d0[s] for s in sorted(set(d0) & set(d1))]
            rows.append({"contrast": f"change of ({topk} vs {scape}) from W={ws[0]}",
                         "workers": w, **t_row(dd, confidence, 1)})
    return pd.DataFrame(rows)


def comm_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean bytes and coordinates per W and method (over seeds)."""
    cols = ["hand_in_bytes", "wire_bytes", "coords_sent_per_worker", "coords_moved_by_sync",
            "pair_overlap", "mask_agreement", "n_params"]
    out = runs.groupby(["workers", "run"], as_index=False)[cols].mean(numeric_only=True)
    out["moved_fraction"] = out.coords_moved_by_sync / out.n_params
    return out


def sweep_table(stage_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The sweep's runs and its winners (``sweep/sweep.json``)."""
    record = read_json(Path(stage_dir) / "sweep" / "sweep.json")
    return pd.DataFrame(record["rows"]).assign(seed=record["seed"]), record["winners"]


def write_analysis(stage_dir: str | Path, out_dir: str | Path,
                   confidence: float = 0.95) -> dict[str, pd.DataFrame]:
    """Every table and figure of the module docstring into ``out_dir``; returns the tables."""
    from lmrepro.scape.study.workers_plots import plot_bytes, plot_gaps

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(stage_dir)
    sweep, winners = sweep_table(stage_dir)
    tables = {"runs": runs, "gaps": gap_table(runs, confidence), "pairs": pair_table(runs,
                                                                                     confidence),
              "comm": comm_table(runs), "sweep": sweep,
              "winners": pd.DataFrame([{"point": k, **v} for k, v in winners.items()])}
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
    plot_gaps(tables["gaps"], out / "gap_vs_workers.png")
    plot_bytes(tables["comm"], tables["gaps"], out / "bytes_vs_workers.png")
    return tables


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
             f"seeds {', '.join(str(s) for s in seeds)}, test split; gaps to dense AdamS with "
             "one-sided 95 % t bounds over seeds, Holm-adjusted p over the study's contrasts "
             "and Bonferroni bounds (all contrasts at once). Workers simulated in one process "
             "(the torchrun path's numbers; no timing is a result).", "",
             "| W | method | gap [L, U] | p (Holm) | Bonferroni [L, U] | bytes sent per worker "
             "per step | coordinates with a synced gradient | top-k mask overlap | SCAPE mask "
             "agreement |", "|---:|---|---|---:|---|---:|---:|---:|---:|"]
    both = gaps.merge(comm, on=["workers", "run"], how="left")
    for r in both.itertuples():
        lines.append(
            f"| {r.workers} | {r.run} | {_pct(r.gap_pct)} [{_pct(r.lower_pct)}, "
            f"{_pct(r.upper_pct)}] | {r.p_two_sided:.2g} ({r.p_holm:.2g}) | "
            f"[{_pct(r.bonferroni_lower_pct)}, {_pct(r.bonferroni_upper_pct)}] | "
            f"{r.wire_bytes / 1e3:.1f} kB | {100 * r.moved_fraction:.1f} % | "
            + ("" if pd.isna(r.pair_overlap) else f"{r.pair_overlap:.2f}") + " | "
            + ("" if pd.isna(r.mask_agreement) else f"{r.mask_agreement:.2f}") + " |")
    dense = comm[comm.run == BASELINE].set_index("workers")["wire_bytes"]
    lines += ["", "Dense AdamS sends " + ", ".join(f"{dense[w] / 1e3:.0f} kB at W = {w}"
                                                   for w in dense.index) + " per worker per step.",
              "", "Top-k against SCAPE at the same sparsity (test split, paired by seed), and "
              "how that difference moves with W:", "", "| contrast | W | difference [L, U] | p |",
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
