"""Tests of the analysis tables and plots on small run directories written in the documented
layout (:mod:`lmrepro.results`): real files, made up numbers."""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.figure import Figure

from lmrepro import analysis as A
from lmrepro.errors import ParameterError
from lmrepro.io import append_jsonl
from lmrepro.results import write_eval_losses, write_summary
from lmrepro.stats import noninferiority

N_RES = 2000
GIB = 1 << 30
N_EVAL = 60


def base_losses(seed: int = 0, n: int = N_EVAL) -> np.ndarray:
    return np.random.default_rng(100 + seed).uniform(1.2, 1.8, n)


def make_run(root: Path, name: str, method: str, *, corpus: str = "shakespeare",
             losses: Any = None, rel: float = 0.0, noise: float = 0.002, seed: int = 0,
             step_time: float = 1.0, tps: float = 1000.0, peak_gib: float = 1.0,
             bytes_per_step: dict | None = None, metrics_bytes: dict | None = None,
             steps: int = 10, **extra: Any) -> Path:
    """Write summary.json, eval_losses.json and metrics.jsonl for one run."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    if losses is None:
        b = base_losses(seed)
        noise_rng = np.random.default_rng([zlib.crc32(name.encode()), seed])
        losses = b * (1.0 + rel + noise_rng.normal(0.0, noise, b.size))
    write_eval_losses(run_dir, list(losses), batch_size=8, context=64)
    summary = {"name": name, "method": method, "corpus": corpus, "steps": steps,
               "tokens": steps * 512, "final_bpb": float(np.mean(losses)) / math.log(2),
               "tokens_per_s": tps, "mean_step_time_s": step_time,
               "peak_rss_bytes": int(peak_gib * GIB), "seed": seed, **extra}
    if bytes_per_step is not None:
        summary["bytes_per_step"] = bytes_per_step
    write_summary(run_dir, summary)
    for step in range(steps):
        rec = {"step": step, "loss": 3.0 - 0.1 * step, "lr": 1e-3, "step_time_s": step_time}
        if metrics_bytes is not None:
            rec.update({f"bytes_{k}": v * (step + 1) for k, v in metrics_bytes.items()})
        append_jsonl(run_dir / "metrics.jsonl", rec)
    append_jsonl(run_dir / "metrics.jsonl", {"step": steps, "eval_bpb": 2.5})
    return run_dir


def test_throughput_speedup_and_ratio(tmp_path: Path) -> None:
    runs = {"dense": make_run(tmp_path, "dense", "adams", step_time=1.0, tps=1000.0),
            "sparse": make_run(tmp_path, "sparse", "scape", step_time=0.5, tps=1500.0)}
    df = A.throughput_table(runs, baseline="dense").set_index("run")
    assert df.loc["sparse", "speedup"] == 2.0
    assert df.loc["dense", "speedup"] == 1.0
    assert df.loc["sparse", "throughput_ratio"] == 1.5
    assert df.loc["sparse", "mean_step_time_s"] == 0.5
    assert list(df.method) == ["adams", "scape"]


def test_baseline_must_be_one_of_the_runs(tmp_path: Path) -> None:
    runs = {"a": make_run(tmp_path, "a", "adamw")}
    with pytest.raises(ParameterError) as info:
        A.throughput_table(runs, baseline="nope")
    assert info.value.name == "baseline" and "'a'" in str(info.value)
    with pytest.raises(ParameterError):
        A.throughput_table({"x": tmp_path / "missing"}, baseline="x")


def test_memory_table_gib_and_ratio(tmp_path: Path) -> None:
    runs = {"bp": make_run(tmp_path, "bp", "backprop", peak_gib=2.0),
            "rgc": make_run(tmp_path, "rgc", "rgc_async", peak_gib=4.5)}
    df = A.memory_table(runs, baseline="bp").set_index("run")
    assert df.loc["rgc", "peak_gib"] == 4.5
    assert df.loc["rgc", "ratio_vs_baseline"] == 2.25
    assert df.loc["bp", "peak_rss_bytes"] == 2 * GIB


def test_communication_table(tmp_path: Path) -> None:
    dense = {"grad_values": 800.0, "param_values": 200.0, "mask": 0.0, "total": 1000.0}
    sparse = {"grad_values": 60.0, "param_values": 20.0, "mask": 20.0, "total": 100.0}
    runs = {
        "dense": make_run(tmp_path, "dense", "adams", bytes_per_step=dense, world_size=4),
        "scape": make_run(tmp_path, "scape", "scape", bytes_per_step=sparse, world_size=4,
                          sparsity=0.9),
        # no summary bytes: falls back to the mean of the metrics' bytes_* fields
        "topk": make_run(tmp_path, "topk", "topk_ef", world_size=4, sparsity=0.9,
                         metrics_bytes={"grad_values": 10.0, "param_values": 20.0, "mask": 30.0,
                                        "total": 60.0}, steps=3),
        "single": make_run(tmp_path, "single", "adamw"),  # no communication: left out
    }
    df = A.communication_table(runs, dense="dense").set_index("run")
    assert list(df.index) == ["dense", "scape", "topk"]
    assert df.loc["scape", "ratio_vs_dense"] == pytest.approx(0.1)
    assert df.loc["scape", "mask"] == 20.0
    # metrics steps 0..2 scale each kind by 1, 2, 3: mean factor 2
    assert df.loc["topk", "grad_values"] == pytest.approx(20.0)
    assert df.loc["topk", "total"] == pytest.approx(120.0)
    assert df.loc["topk", "ratio_vs_dense"] == pytest.approx(0.12)
    long = A.bytes_long(runs)
    assert set(long.kind) == {"grad_values", "param_values", "mask"}
    assert len(long) == 9
    with pytest.raises(ParameterError):
        A.communication_table(runs, dense="single")


def test_method_roles() -> None:
    assert A.method_role("AdamW") == A.ROLE_ADAMW
    assert A.method_role("dense-adams") == A.ROLE_ADAMS
    assert A.method_role("scape") == A.ROLE_SCAPE
    assert A.method_role("topk_ef") == A.ROLE_TOPK
    assert A.method_role("rgc_async") == A.ROLE_RGC_ASYNC
    assert A.method_role("rgc-sync") == A.ROLE_RGC_SYNC
    assert A.method_role("rgc", executor="async") == A.ROLE_RGC_ASYNC
    assert A.method_role("global_backprop") == A.ROLE_BACKPROP
    assert A.method_role("backprop") == A.ROLE_BACKPROP
    assert A.method_role("rgc", executor="sync") == A.ROLE_RGC_SYNC
    assert A.method_role("topk") == A.ROLE_TOPK
    assert A.method_role("backprop-adamw") is None  # the single-process trainer
    assert A.method_role("sgd") is None


def test_noninferiority_table_matches_the_test_on_pooled_pairs(tmp_path: Path) -> None:
    runs = {}
    for seed in (0, 1):
        runs[f"bp{seed}"] = make_run(tmp_path, f"bp{seed}", "backprop", seed=seed)
        # the shape lmrepro.rgc writes: method "rgc" and the executor
        runs[f"rgc{seed}"] = make_run(tmp_path, f"rgc{seed}", "rgc", executor="async",
                                      seed=seed, rel=0.03)
        runs[f"sync{seed}"] = make_run(tmp_path, f"sync{seed}", "rgc", executor="sync",
                                       seed=seed, rel=0.0)
    runs["single"] = make_run(tmp_path, "single", "backprop-adamw")  # no role: not compared
    df = A.noninferiority_table(runs, n_resamples=N_RES)
    assert len(df) == 2
    row = df[df.candidate == "rgc0+rgc1"].iloc[0]
    assert row.baseline == "bp0+bp1" and row.candidate == "rgc0+rgc1"
    assert row.pairs == 2 * N_EVAL
    b = np.concatenate([A.load_run("x", runs[n]).eval_losses for n in ("bp0", "bp1")])
    c = np.concatenate([A.load_run("x", runs[n]).eval_losses for n in ("rgc0", "rgc1")])
    direct = noninferiority(b, c, n_resamples=N_RES)
    assert row.mean_rel_diff == pytest.approx(direct.mean_rel_diff, rel=1e-12)
    assert row.upper_bound == pytest.approx(direct.upper_bound, rel=1e-12)
    assert row.verdict == "not non-inferior" and not row.non_inferior
    assert row.comparison == "rgc-async vs backprop (shakespeare)"
    sync = df[df.candidate == "sync0+sync1"].iloc[0]
    assert sync.non_inferior and sync.verdict == "non-inferior"
    assert sync.comparison == "rgc-sync vs backprop (shakespeare)"
    assert sync.margin == 0.01
    assert "nats" in df.attrs["note"] and "bits per byte" in df.attrs["note"]


def test_explicit_comparisons_and_pairing_checks(tmp_path: Path) -> None:
    runs = {"a": make_run(tmp_path, "a", "adamw"),
            "b": make_run(tmp_path, "b", "scape", rel=0.002, sparsity=0.9),
            "short": make_run(tmp_path, "short", "scape", losses=base_losses()[:10]),
            "other": make_run(tmp_path, "other", "scape", corpus="enwik8")}
    df = A.noninferiority_table(runs, [("a", "b")], n_resamples=N_RES)
    assert df.iloc[0].comparison == "b vs a" and df.iloc[0].non_inferior
    with pytest.raises(ParameterError) as info:
        A.noninferiority_table(runs, [("a", "short")], n_resamples=N_RES)
    assert "same 60 eval batches" in str(info.value)
    with pytest.raises(ParameterError, match="same corpus"):
        A.noninferiority_table(runs, [("a", "other")], n_resamples=N_RES)


def test_diverged_candidate_is_not_non_inferior(tmp_path: Path) -> None:
    losses = base_losses()
    losses[5] = float("nan")
    runs = {"adams": make_run(tmp_path, "adams", "adams", world_size=2),
            "topk": make_run(tmp_path, "topk", "topk_ef", losses=losses, sparsity=0.99,
                             world_size=2)}
    df = A.noninferiority_table(runs, n_resamples=N_RES)
    assert len(df) == 1
    assert not df.iloc[0].non_inferior and "diverged" in df.iloc[0].verdict


def full_profile(root: Path, with_enwik8: bool) -> dict[str, Path]:
    """A small profile with every role; numbers chosen so each rule's outcome is known."""
    d = {"grad_values": 1000.0, "param_values": 1000.0, "mask": 0.0, "total": 2000.0}
    runs = {
        "adamw": make_run(root, "adamw", "adamw", world_size=4, step_time=1.2, bytes_per_step=d),
        "adams": make_run(root, "adams", "adams", world_size=4, step_time=1.0, bytes_per_step=d),
        "scape90": make_run(root, "scape90", "scape", world_size=4, sparsity=0.9,
                            step_time=0.5, rel=0.001),
        "scape99": make_run(root, "scape99", "scape", world_size=4, sparsity=0.99,
                            step_time=0.4, rel=0.05),  # quality lost: claim not reproduced
        "topk99": make_run(root, "topk99", "topk", world_size=4, sparsity=0.99, rel=0.2),
        "bp": make_run(root, "bp", "backprop", executor="backprop", corpus="tinystories",
                       tps=1000.0, peak_gib=2.0, threads=8, total_threads=8, n_layers=24,
                       d_model=64),
        "rgc": make_run(root, "rgc", "rgc", executor="async", corpus="tinystories", tps=800.0,
                        peak_gib=4.0, rel=0.03, threads=[2, 2, 2, 2], total_threads=8,
                        n_layers=24, d_model=64),
        "sync": make_run(root, "sync", "rgc", executor="sync", corpus="tinystories",
                         tps=500.0, threads=8, total_threads=8),
    }
    if with_enwik8:
        runs["bp8"] = make_run(root, "bp8", "backprop", corpus="enwik8", tps=1000.0)
        runs["rgc8"] = make_run(root, "rgc8", "rgc", executor="async", corpus="enwik8",
                                tps=1500.0, rel=0.0, noise=0.001)
    return runs


def test_claims_table_quick_profile(tmp_path: Path) -> None:
    runs = full_profile(tmp_path, with_enwik8=False)
    df = A.claims_table(runs, n_resamples=N_RES).set_index("id")
    assert set(df.index) == {c.id for c in A.CLAIMS}
    assert df.loc["scape-90-adamw", "reproduced"] == "yes"
    assert df.loc["scape-90-adams", "reproduced"] == "yes"
    assert df.loc["scape-99-adams", "reproduced"] == "no"
    assert "not non-inferior" in df.loc["scape-99-adams", "measured"]
    # best per-step speedup vs dense AdamS: 1.0 / 0.4
    assert df.loc["scape-step-speedup", "measured_value"] == pytest.approx(2.5)
    assert df.loc["scape-step-speedup", "reproduced"] == "yes"
    # wall-clock vs the faster dense run (AdamS, 1.0 s x 10 steps): 1 - 0.4 / 1.0
    assert df.loc["scape-wallclock", "measured_value"] == pytest.approx(0.6)
    assert df.loc["topk-unstable", "reproduced"] == "yes"
    assert df.loc["rgc-throughput", "measured_value"] == pytest.approx(0.8)
    assert df.loc["rgc-throughput", "reproduced"] == "no"
    assert df.loc["rgc-memory", "measured_value"] == pytest.approx(2.0)
    assert df.loc["rgc-memory", "reproduced"] == "yes"
    assert "4.000 vs 2.000 GiB" in df.loc["rgc-memory", "measured"]
    assert df.loc["rgc-tinystories", "reproduced"] == "yes"
    assert df.loc["rgc-tinystories", "measured_value"] == pytest.approx(0.03, abs=0.002)
    assert df.loc["rgc-enwik8", "reproduced"] == A.NOT_RUN
    assert df.loc["rgc-enwik8", "measured"] == A.NOT_RUN
    assert df.paper_figure.str.startswith("paper:").all()
    assert df.loc["rgc-memory", "our_scale"] == "24 layers x d=64, 10 steps, tinystories, 8 threads"
    assert "4 workers" in df.loc["scape-90-adamw", "our_scale"]


def test_claims_table_enwik8_present(tmp_path: Path) -> None:
    runs = full_profile(tmp_path, with_enwik8=True)
    df = A.claims_table(runs, n_resamples=N_RES)
    enwik = df[df.id == "rgc-enwik8"]
    assert len(enwik) == 1
    # our RGC matches backprop here, so the paper's negative verdict is not reproduced
    assert enwik.iloc[0].reproduced == "no" and enwik.iloc[0].corpus == "enwik8"
    tput = df[df.id == "rgc-throughput"].set_index("corpus")
    assert tput.loc["enwik8", "measured_value"] == pytest.approx(1.5)
    assert tput.loc["enwik8", "reproduced"] == "yes"


def test_claims_table_with_no_runs_of_a_paper(tmp_path: Path) -> None:
    runs = {"bp": make_run(tmp_path, "bp", "backprop")}
    df = A.claims_table(runs, n_resamples=N_RES)
    assert (df.reproduced == A.NOT_RUN).all()


def test_plots_return_figures(tmp_path: Path) -> None:
    runs = full_profile(tmp_path, with_enwik8=False)
    fig = A.plot_loss_curves(runs)
    assert isinstance(fig, Figure)
    frame = A.loss_curves_frame(runs)
    train = frame[(frame.run == "adamw") & (frame.kind == "train")]
    assert train.bpb.iloc[0] == pytest.approx(3.0 / math.log(2))
    assert (frame[frame.kind == "eval"].bpb == 2.5).all()
    assert len(frame[frame.run == "adamw"]) == 11  # 10 train records + 1 eval record

    fig = A.plot_bytes_per_step(runs)
    assert isinstance(fig, Figure)
    assert fig.axes[0].get_yscale() == "log"

    outcomes = A.run_comparisons(runs, n_resamples=N_RES)
    fig = A.plot_bootstrap(outcomes)
    with_result = [o for o in outcomes if o.result is not None]
    ax = fig.axes[0]
    xs = [line.get_xdata()[0] for line in ax.lines]
    assert with_result[0].result.margin * 100 in xs
    assert with_result[0].result.upper_bound * 100 == pytest.approx(xs[1])
    fig.savefig(tmp_path / "boot.png")
    assert (tmp_path / "boot.png").stat().st_size > 0
