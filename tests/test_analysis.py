"""Tests of the analysis tables, the claims and the plots on small run directories written in the
documented layout (:mod:`lmrepro.results`): real files, made up numbers."""

from __future__ import annotations

import math
import shutil
import zlib
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

import lmrepro.stats
from lmrepro.errors import ParameterError
from lmrepro.io import append_jsonl, read_json
from lmrepro.pipeline import analysis as A
from lmrepro.pipeline import claims as C
from lmrepro.pipeline import plots as P
from lmrepro.results import Method, mean_bytes, write_eval_losses, write_summary
from lmrepro.stats import StatsConfig, noninferiority

N_RES = 2000
STATS = StatsConfig(n_resamples=N_RES)
GIB = 1 << 30
N_EVAL = 60


def base_losses(seed: int = 0, n: int = N_EVAL) -> np.ndarray:
    return np.random.default_rng(100 + seed).uniform(1.2, 1.8, n)


def make_run(root: Path, name: str, method: str, *, corpus: str = "shakespeare",
             losses: Any = None, rel: float = 0.0, noise: float = 0.002, seed: int = 0,
             step_time: float = 1.0, tps: float = 1000.0, peak_gib: float = 1.0,
             bytes_per_step: dict | None = None, metrics_bytes: dict | None = None,
             steps: int = 10, processes: int = 1, threads: int = 1, **extra: Any) -> Path:
    """Write a valid summary.json (:class:`lmrepro.results.RunSummary`), eval_losses.json and
    metrics.jsonl for one run."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    if losses is None:
        b = base_losses(seed)
        noise_rng = np.random.default_rng([zlib.crc32(name.encode()), seed])
        losses = b * (1.0 + rel + noise_rng.normal(0.0, noise, b.size))
    write_eval_losses(run_dir, list(losses), batch_size=8, context=64)
    # RunSummary refuses non-finite numbers: a diverged eval batch shows in eval_losses.json only
    summary = {"name": name, "method": method, "corpus": corpus, "steps": steps,
               "tokens": steps * 512, "final_bpb": float(np.nanmean(losses)) / math.log(2),
               "tokens_per_s": tps, "mean_step_time_s": step_time,
               "train_time_s": steps * step_time, "peak_rss_bytes": int(peak_gib * GIB),
               "seed": seed, "n_params": 0, "processes": processes, "threads": threads, **extra}
    records = [{"step": step, "loss": 3.0 - 0.1 * step, "lr": 1e-3, "step_time_s": step_time,
                **{f"bytes_{k}": v * (step + 1) for k, v in (metrics_bytes or {}).items()}}
               for step in range(steps)]
    for rec in records + [{"step": steps, "eval_bpb": 2.5}]:
        append_jsonl(run_dir / "metrics.jsonl", rec)
    # as the trainers summarise them: given, or the mean over the metrics records
    write_summary(run_dir, {**summary, "bytes_per_step": bytes_per_step or mean_bytes(records)})
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
            "rgc": make_run(tmp_path, "rgc", "rgc", executor="async", peak_gib=4.5)}
    df = A.memory_table(runs, baseline="bp").set_index("run")
    assert df.loc["rgc", "peak_gib"] == 4.5
    assert df.loc["rgc", "ratio_vs_baseline"] == 2.25
    assert df.loc["bp", "peak_rss_bytes"] == 2 * GIB


def test_communication_table(tmp_path: Path) -> None:
    dense = {"grad_values": 800.0, "param_values": 200.0, "mask": 0.0, "total": 1000.0}
    sparse = {"grad_values": 60.0, "param_values": 20.0, "mask": 20.0, "total": 100.0}
    runs = {
        "dense": make_run(tmp_path, "dense", "adams", bytes_per_step=dense, processes=4),
        "scape": make_run(tmp_path, "scape", "scape", bytes_per_step=sparse, processes=4,
                          sparsity=0.9),
        # bytes per step summarised from the metrics' bytes_* fields
        "topk": make_run(tmp_path, "topk", "topk", processes=4, sparsity=0.9,
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


def test_role_from_method_and_executor(tmp_path: Path) -> None:
    assert [A.run_role(m) for m in (Method.ADAMW, "adams", Method.SCAPE, Method.TOPK,
                                     Method.BACKPROP)] == list(A.DATA_PARALLEL) + [A.ROLE_BACKPROP]
    assert A.run_role(Method.BACKPROP, executor="backprop") == A.ROLE_BACKPROP
    assert A.run_role(Method.RGC, executor="async") == A.ROLE_RGC_ASYNC
    assert A.run_role(Method.RGC, executor="sync") == A.ROLE_RGC_SYNC
    # no guessing from spellings: an unknown method or an RGC run without its executor is refused
    for method, executor, name in [("topk_ef", None, "method"), ("AdamW", None, "method"),
                                   ("rgc_async", None, "method"), (Method.RGC, None, "executor"),
                                   (Method.SCAPE, "async", "executor")]:
        with pytest.raises(ParameterError) as info:
            A.run_role(method, executor)
        assert info.value.name == name
    with pytest.raises(ParameterError, match=r"must be one of \['backprop', 'adamw'"):
        A.run_role("sgd")
    # the role of a loaded run comes from its summary
    run = A.load_run("r", make_run(tmp_path, "r", "rgc", executor="sync"))
    assert run.role == A.ROLE_RGC_SYNC and run.world_size is None
    run = A.load_run("s", make_run(tmp_path, "s", "scape", sparsity=0.9, processes=4))
    assert run.role == A.ROLE_SCAPE and run.world_size == 4


def test_noninferiority_table_matches_the_test_on_pooled_pairs(tmp_path: Path) -> None:
    runs = {}
    for seed in (0, 1):
        runs[f"bp{seed}"] = make_run(tmp_path, f"bp{seed}", "backprop", seed=seed)
        # the shape lmrepro.rgc writes: method "rgc" and the executor
        runs[f"rgc{seed}"] = make_run(tmp_path, f"rgc{seed}", "rgc", executor="async",
                                      seed=seed, rel=0.03)
        runs[f"sync{seed}"] = make_run(tmp_path, f"sync{seed}", "rgc", executor="sync",
                                       seed=seed, rel=0.0)
    runs["single"] = make_run(tmp_path, "single", "adamw")  # no SCAPE/top-k run: not compared
    df = A.noninferiority_table(runs, stats=STATS)
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
    df = A.noninferiority_table(runs, [("a", "b")], stats=STATS)
    assert df.iloc[0].comparison == "b vs a" and df.iloc[0].non_inferior
    with pytest.raises(ParameterError) as info:
        A.noninferiority_table(runs, [("a", "short")], stats=STATS)
    assert "same 60 eval batches" in str(info.value)
    with pytest.raises(ParameterError, match="same corpus"):
        A.noninferiority_table(runs, [("a", "other")], stats=STATS)


def test_diverged_candidate_is_not_non_inferior(tmp_path: Path) -> None:
    losses = base_losses()
    losses[5] = float("nan")
    runs = {"adams": make_run(tmp_path, "adams", "adams", processes=2),
            "topk": make_run(tmp_path, "topk", "topk", losses=losses, sparsity=0.99,
                             processes=2)}
    df = A.noninferiority_table(runs, stats=STATS)
    assert len(df) == 1
    assert not df.iloc[0].non_inferior and "diverged" in df.iloc[0].verdict


def full_profile(root: Path, with_enwik8: bool) -> dict[str, Path]:
    """A small profile with every role; numbers chosen so each rule's outcome is known. Model
    shapes are where the trainers write them: ``config.model`` (data-parallel and baseline
    trainers) or the flat RGC config."""
    d = {"grad_values": 1000.0, "param_values": 1000.0, "mask": 0.0, "total": 2000.0}
    rgc_shape = {"config": {"n_layers": 24, "d_model": 64}}
    runs = {
        "adamw": make_run(root, "adamw", "adamw", processes=4, step_time=1.2, bytes_per_step=d),
        "adams": make_run(root, "adams", "adams", processes=4, step_time=1.0, bytes_per_step=d),
        "scape90": make_run(root, "scape90", "scape", processes=4, sparsity=0.9,
                            step_time=0.5, rel=0.001,
                            config={"model": {"n_layers": 4, "d_model": 32}}),
        "scape99": make_run(root, "scape99", "scape", processes=4, sparsity=0.99,
                            step_time=0.4, rel=0.05),  # quality lost: claim not reproduced
        "topk99": make_run(root, "topk99", "topk", processes=4, sparsity=0.99, rel=0.2),
        "bp": make_run(root, "bp", "backprop", executor="backprop", corpus="tinystories",
                       tps=1000.0, peak_gib=2.0, threads=8, **rgc_shape),
        "rgc": make_run(root, "rgc", "rgc", executor="async", corpus="tinystories", tps=800.0,
                        peak_gib=4.0, rel=0.03, processes=4, threads=8, **rgc_shape),
        "sync": make_run(root, "sync", "rgc", executor="sync", corpus="tinystories",
                         tps=500.0, threads=8),
    }
    if with_enwik8:
        runs["bp8"] = make_run(root, "bp8", "backprop", corpus="enwik8", tps=1000.0)
        runs["rgc8"] = make_run(root, "rgc8", "rgc", executor="async", corpus="enwik8",
                                tps=1500.0, rel=0.0, noise=0.001)
    return runs


def claims(runs: dict[str, Path]) -> pd.DataFrame:
    """The claims table of ``runs`` from their analysis records, as the claims stage reads it."""
    return C.claims_table(A.analysis_records(runs, stats=STATS))


def test_claims_table_quick_profile(tmp_path: Path) -> None:
    runs = full_profile(tmp_path, with_enwik8=False)
    df = claims(runs).set_index("id")
    assert set(df.index) == {c.id for c in C.registry()}
    assert len(C.registry()) == 11
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
    assert df.loc["rgc-enwik8", "reproduced"] == C.NOT_RUN
    assert df.loc["rgc-enwik8", "measured"] == C.NOT_RUN
    assert df.paper_figure.str.startswith("paper:").all()
    assert df.loc["rgc-memory", "our_scale"] == "24 layers x d=64, 10 steps, tinystories, 8 threads"
    assert "4 workers" in df.loc["scape-90-adamw", "our_scale"]
    assert df.loc["scape-90-adamw", "our_scale"].startswith("4 layers x d=32, 10 steps")
    assert all(c.source for c in C.registry())


def test_claims_table_enwik8_present(tmp_path: Path) -> None:
    runs = full_profile(tmp_path, with_enwik8=True)
    df = claims(runs)
    enwik = df[df.id == "rgc-enwik8"]
    assert len(enwik) == 1
    # our RGC matches backprop here, so the paper's negative verdict is not reproduced
    assert enwik.iloc[0].reproduced == "no" and enwik.iloc[0].corpus == "enwik8"
    tput = df[df.id == "rgc-throughput"].set_index("corpus")
    assert tput.loc["enwik8", "measured_value"] == pytest.approx(1.5)
    assert tput.loc["enwik8", "reproduced"] == "yes"


def test_claims_table_with_no_runs_of_a_paper(tmp_path: Path) -> None:
    runs = {"bp": make_run(tmp_path, "bp", "backprop")}
    df = claims(runs)
    assert (df.reproduced == C.NOT_RUN).all()


def test_analysis_stage_and_claims_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The analysis stage picks its references by role (the runs are renamed here) and writes
    analysis.json; the claims stage reads it (the absent RGC stage's claims are not run) and
    recomputes no bootstrap."""
    runs = full_profile(tmp_path / "all", with_enwik8=False)
    stage_runs = tmp_path / "results" / "scape" / "runs" / "shakespeare"
    stage_runs.mkdir(parents=True)
    for name, new in {"adamw": "dense-w", "adams": "dense-s", "scape90": "s90", "scape99": "s99",
                      "topk99": "t99"}.items():
        shutil.move(runs[name], stage_runs / new)
    out = tmp_path / "results" / "analysis"
    result = A.analysis_stage("scape", STATS, tmp_path / "results", out)
    assert (result["tables"]["throughput"].baseline == "shakespeare/dense-w").all()
    assert (result["tables"]["memory"].baseline == "shakespeare/dense-w").all()
    assert (result["tables"]["communication"].dense == "shakespeare/dense-s").all()
    saved = A.read_analysis(out / "scape" / "analysis.json")
    assert saved == result["records"] and saved.stage == "scape" and saved.stats == STATS
    assert {r.name: r.role for r in saved.runs}["shakespeare/t99"] == A.ROLE_TOPK
    ni = read_json(out / "scape" / "noninferiority.json")
    assert ni == {c.label: {"mean_rel_diff": c.mean_rel_diff, "upper_bound": c.upper_bound,
                            "non_inferior": c.non_inferior, "pairs": c.n_pairs}
                  for c in saved.comparisons} and len(ni) == 6

    def no_bootstrap(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the claims stage must not rerun the bootstrap")

    monkeypatch.setattr(lmrepro.stats, "noninferiority", no_bootstrap)
    monkeypatch.setattr(A, "noninferiority", no_bootstrap)
    table = C.claims_stage(out, out).set_index("id")
    assert table.equals(C.claims_table(C.merge_records({"scape": saved})).set_index("id"))
    assert table.loc["scape-step-speedup", "measured"] == (
        "2.500x per step (scape/shakespeare/s99 vs scape/shakespeare/dense-s)")
    assert (table[table.paper.str.startswith("RGC")].reproduced == C.NOT_RUN).all()
    assert read_json(out / "claims.json") == {
        "claims": 11, "reproduced_yes": int((table.reproduced == "yes").sum()),
        "reproduced_no": int((table.reproduced == "no").sum()), "not_run": 4}


def test_plots_return_figures(tmp_path: Path) -> None:
    runs = full_profile(tmp_path, with_enwik8=False)
    fig = P.plot_loss_curves(runs)
    assert isinstance(fig, Figure)
    frame = P.loss_curves_frame(runs)
    train = frame[(frame.run == "adamw") & (frame.kind == "train")]
    assert train.bpb.iloc[0] == pytest.approx(3.0 / math.log(2))
    assert (frame[frame.kind == "eval"].bpb == 2.5).all()
    assert len(frame[frame.run == "adamw"]) == 11  # 10 train records + 1 eval record

    fig = P.plot_bytes_per_step(runs)
    assert isinstance(fig, Figure)
    assert fig.axes[0].get_yscale() == "log"

    outcomes = A.run_comparisons(runs, stats=STATS)
    fig = P.plot_bootstrap(outcomes)
    with_result = [o for o in outcomes if o.result is not None]
    ax = fig.axes[0]
    xs = [line.get_xdata()[0] for line in ax.lines]
    assert with_result[0].result.margin * 100 in xs
    assert with_result[0].result.upper_bound * 100 == pytest.approx(xs[1])
    fig.savefig(tmp_path / "boot.png")
    assert (tmp_path / "boot.png").stat().st_size > 0
    P.save_figure(fig, tmp_path / "saved.png")
    assert (tmp_path / "saved.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
