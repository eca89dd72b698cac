"""The pure helpers behind the benchmarks (lmrepro.bench): fast, no network namespace, no timing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmrepro.bench.alphabeta import (AlphaBeta, comm_time, fit_alpha_beta, fraction_of_ideal,
                                     ideal_step_time, speedup)
from lmrepro.bench.flops import matmul_flops, mfu, model_matmul_shapes
from lmrepro.bench.netns import (LO_MTU, SHAPED_MTU, namespace_name, netns_exec_prefix,
                                 tbf_burst_bytes, tbf_command)
from lmrepro.bench.timing import PhaseTimer, summarize
from lmrepro.model import ModelConfig, train_flops_per_token

SIZES = [1024 * 4 ** i for i in range(8)]


@pytest.mark.parametrize("relative", [True, False])
def test_fit_recovers_alpha_beta_exactly(relative):
    alpha, beta = 2.5e-4, 1 / 12.5e6          # 0.25 ms, 12.5 MB/s (100 Mbit/s)
    t = [alpha + beta * n for n in SIZES]
    fit = fit_alpha_beta(SIZES, t, relative=relative)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(12.5e6)
    assert fit.r2 == pytest.approx(1.0) and fit.max_rel_err < 1e-6 and fit.n_points == 8


def test_fit_with_noise_and_repeats():
    rng = np.random.default_rng(0)
    alpha, beta = 1e-3, 8e-9
    xs = [n for n in SIZES for _ in range(5)]
    ts = [(alpha + beta * n) * (1 + 0.02 * rng.standard_normal()) for n in xs]
    fit = fit_alpha_beta(xs, ts)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.05)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=0.05)


def test_fit_clips_negative_alpha_and_rejects_bad_input():
    fit = fit_alpha_beta([1000, 2000, 4000], [0.9e-3, 2.0e-3, 4.1e-3])
    assert fit.alpha_s >= 0.0 and fit.beta_s_per_byte == pytest.approx(1e-6, rel=0.1)
    flat = fit_alpha_beta([1000, 2000], [2e-3, 1e-3])       # falling times: pure noise
    assert flat.beta_s_per_byte == 0.0 and 1e-3 <= flat.alpha_s <= 2e-3
    with pytest.raises(ValueError):
        fit_alpha_beta([1000, 1000], [1.0, 1.1])
    with pytest.raises(ValueError):
        fit_alpha_beta([1, 2], [1.0])


def test_predict_and_comm_time():
    ab = AlphaBeta(1e-3, 1e-8)
    assert ab.predict(0) == 0.0
    assert ab.predict(1e6) == pytest.approx(1e-3 + 1e-2)
    models = {"all_reduce": ab, "all_gather": AlphaBeta(0.0, 2e-8)}
    assert comm_time(models, [("all_reduce", 1e6), ("all_gather", 1e6)]) == \
        pytest.approx(0.011 + 0.02)
    with pytest.raises(KeyError):
        comm_time(models, [("broadcast", 1)])


def test_ideal_step_and_speedup_formula():
    # dense: 0.6 s compute + 2.0 s all-reduce; sparse: 0.65 s + 0.05 s blocking, a 0.1 s async
    # mask all-gather hidden under 0.5 s of forward/backward.
    dense = ideal_step_time(0.6, 2.0)
    sparse = ideal_step_time(0.65, 0.05, async_comm_s=0.1, overlap_window_s=0.5)
    assert dense == pytest.approx(2.6) and sparse == pytest.approx(0.70)
    assert ideal_step_time(0.65, 0.05, 0.8, 0.5) == pytest.approx(1.0)   # 0.3 s not hidden
    s_ideal = speedup(dense, sparse)
    assert s_ideal == pytest.approx(2.6 / 0.7)
    assert fraction_of_ideal(0.9 * s_ideal, s_ideal) == pytest.approx(0.9)
    with pytest.raises(ValueError):
        ideal_step_time(-1.0, 0.0)
    with pytest.raises(ValueError):
        speedup(0.0, 1.0)


def test_tbf_command_line():
    cmd = tbf_command(100, 12500, 200, tc="/usr/sbin/tc")
    assert cmd == ["/usr/sbin/tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate",
                   "100mbit", "burst", "12500", "latency", "200ms"]
    assert tbf_command(1000, 1 << 17, 50.5, action="add")[2] == "add"
    assert tbf_command(2.5, 6000, 10)[8] == "2.5mbit"
    with pytest.raises(ValueError):
        tbf_command(0, 1000, 10)
    with pytest.raises(ValueError):
        tbf_command(100, 1000, 10, action="delete")


def test_tbf_burst_bytes():
    # 1 ms at 1 Gbit/s = 125 kB; at 100 Mbit/s 12.5 kB, floored at 4 MTUs.
    assert tbf_burst_bytes(1000, 1.0) == 125_000
    assert tbf_burst_bytes(100, 1.0) == 12_500
    assert tbf_burst_bytes(10, 1.0) == 4 * SHAPED_MTU
    assert tbf_burst_bytes(100, 1.0, mtu=LO_MTU) == 4 * LO_MTU


def test_namespace_helpers():
    assert namespace_name(1234) == "lmrepro-bench-1234"
    assert netns_exec_prefix("lmrepro-bench-1", "/usr/sbin/ip") == [
        "/usr/sbin/ip", "netns", "exec", "lmrepro-bench-1"]


def test_flops_and_mfu():
    assert matmul_flops(2, 3, 4) == 48.0
    assert matmul_flops(2, 3, 4, batch=5) == 240.0
    assert mfu(1000.0, 2e6, 4e9) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mfu(1.0, 1.0, 0.0)
    shapes = model_matmul_shapes(128, 4, 2048)
    assert shapes["mlp_up"] == (2048, 128, 512) and shapes["readout"] == (2048, 128, 256)
    # the model's per-token training FLOPs: 6 x the forward matmul FLOPs per token + attention
    cfg = ModelConfig(n_layers=4, d_model=128, context=128)
    fwd_matmul_per_token = sum(matmul_flops(*s) for s in shapes.values()) / 2048
    block = fwd_matmul_per_token - matmul_flops(1, 128, 256)
    expected = 3 * (cfg.n_layers * block + matmul_flops(1, 128, 256)) + 6 * 4 * 128 * 128
    assert train_flops_per_token(cfg) == pytest.approx(expected)


def test_summarize_and_phase_timer():
    s = summarize([3.0, 1.0, 2.0])
    assert s["median_s"] == 2.0 and s["min_s"] == 1.0 and s["n"] == 3
    assert math.isclose(s["mean_s"], 2.0)
    with pytest.raises(ValueError):
        summarize([])
    pt = PhaseTimer()
    f = pt.wrap("add", lambda a, b: a + b)
    assert f(2, 3) == 5 and f(1, 1) == 2
    assert pt.counts["add"] == 2 and pt.totals["add"] >= 0.0
    assert set(pt.per_call(2)) == {"add"}


def test_optimal_link_bytes_and_link_limit():
    from lmrepro.bench.alphabeta import link_limit_comm_time, optimal_link_bytes

    assert optimal_link_bytes("all_reduce", 100, 2) == 200
    assert optimal_link_bytes("reduce_scatter", 100, 2) == 100
    assert optimal_link_bytes("all_gather", 100, 2) == 200
    assert optimal_link_bytes("all_reduce", 100, 4) == 600
    assert optimal_link_bytes("all_gather", 100, 1) == 0
    with pytest.raises(KeyError):
        optimal_link_bytes("broadcast", 1, 2)
    link = AlphaBeta(1e-3, 1 / 12.5e6)
    t = link_limit_comm_time(link, [("reduce_scatter", 125_000), ("all_gather", 0)], 2)
    assert t == pytest.approx(1e-3 + 0.01)


def test_the_rgc_speedup_factors_reproduce_the_benchmarks_own_ratios() -> None:
    """The decomposition of the stored RGC benchmark multiplies back to the ratios the
    benchmark reported (equal cores, and the paper's 29:24 under a CPU quota)."""
    import json
    from pathlib import Path

    from lmrepro.rgc.analysis import speedup

    bench = Path(__file__).resolve().parents[1] / "bench"
    r = json.loads((bench / "results" / "rgc.json").read_text())
    rows = {label: (f, measured) for label, f, measured in speedup.benchmark_factors(r)}
    f, measured = rows["equal cores"]
    assert f.speedup == pytest.approx(measured, rel=1e-9)
    assert measured == pytest.approx(r["rows"]["async"]["vs_backprop_same_cores"], rel=1e-9)
    paper = [v for k, v in rows.items() if k.startswith("the paper's")]
    if paper:
        f, measured = paper[0]
        assert f.core_ratio == pytest.approx(29 / 24, rel=1e-6)
        assert measured == pytest.approx(r["rows"]["async"]["vs_backprop_paper_ratio"], rel=1e-9)
