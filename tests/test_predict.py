"""The step-time model (lmrepro.scape.steptime.model), its calibration and ``lmrepro predict``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmrepro.cli import main
from lmrepro.errors import ParameterError
from lmrepro.scape.steptime import model as S
from lmrepro.scape.steptime import fit as F
from lmrepro.scape.steptime import paper as P

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "results" / "scape_netns.json"
LINK = S.Link(1e-5, 1e9)


@pytest.mark.parametrize("p", [2, 3, 8, 32])
def test_ring_all_reduce_cost(p: int) -> None:
    n = 4e8
    assert S.ring_all_reduce_s(n, p, LINK) == pytest.approx(
        2 * (p - 1) / p * n / 1e9 + 2 * (p - 1) * 1e-5)
    # reduce-scatter + all-gather is the ring all-reduce
    assert S.ring_reduce_scatter_s(n, p, LINK) + S.ring_all_gather_s(n, p, LINK) == \
        pytest.approx(S.ring_all_reduce_s(n, p, LINK))
    assert S.ring_all_reduce_s(n, 1, LINK) == 0.0


def test_cluster_ring_and_hierarchical_costs() -> None:
    c = S.Cluster(world=32, gpus_per_node=4, inter=S.Link(5e-6, 25e9))
    n = 8e9
    ring = S.all_reduce_s(n, c, "ring")
    assert ring == pytest.approx(2 * 31 / 32 * n / 25e9, rel=1e-3)
    # hierarchical: the network carries 2 (N-1)/N n per node over N = 8 nodes, plus the
    # intra-node reduce-scatter and all-gather
    fast_nvlink = S.Cluster(world=32, gpus_per_node=4, inter=S.Link(5e-6, 25e9),
                            intra=S.Link(0.0, 1e15))
    assert S.all_reduce_s(n, fast_nvlink, "hierarchical") == pytest.approx(
        2 * 7 / 8 * n / 25e9 + 2 * 7 * 5e-6, rel=1e-4)
    assert S.all_reduce_s(n, c, "hierarchical") == pytest.approx(
        S.all_reduce_s(n, fast_nvlink, "hierarchical") + 2 * 3 / 4 * n / 150e9 + 2 * 3 * 2e-6,
        rel=1e-4)
    one_node = S.Cluster(world=4, gpus_per_node=4, intra=S.Link(0.0, 150e9))
    assert S.all_reduce_s(n, one_node) == pytest.approx(S.ring_all_reduce_s(n, 4, one_node.intra))


def test_speedup_tends_to_one_as_bandwidth_grows() -> None:
    w = S.Workload(params=1e9, tokens_per_step=1e6)
    o = S.Options(sparsity=0.99)
    speedups = [S.predict(w, S.Cluster(inter=S.Link(0.0, b)), o)["speedup"]
                for b in (1e9, 1e10, 1e12, 1e15)]
    assert speedups == sorted(speedups, reverse=True)
    # the local work SCAPE adds is all that is left: a little under 1 at infinite bandwidth
    assert 0.97 < speedups[-1] < 1.0
    no_local = S.LocalWork(0.0, 0.0, 0.0, 0.0)
    big = S.Cluster(inter=S.Link(0.0, 1e18))
    assert S.predict(w, big, o, no_local)["speedup"] == pytest.approx(1.0, abs=1e-6)


def test_scape_bytes_scale_with_the_fraction_sent() -> None:
    w = S.Workload(params=1e9, vector_params=1e6)
    c = S.Cluster()
    b1 = S.predict(w, c, S.Options(sparsity=0.99))["scape_value_bytes_per_gpu"]
    b10 = S.predict(w, c, S.Options(sparsity=0.9))["scape_value_bytes_per_gpu"]
    assert b1 == pytest.approx(4 * (0.01 * (1e9 - 1e6) + 1e6))
    assert (b10 - 4e6) == pytest.approx(10 * (b1 - 4e6))
    # the mask: int32 indices above sparsity 31/32 (under 1/32 sent), a bitmap below
    assert S.mask_bytes_per_rank(w, 0.99, 32) == pytest.approx(4 * 0.01 * (1e9 - 1e6) / 32)
    assert S.mask_bytes_per_rank(w, 0.5, 32) == pytest.approx((1e9 - 1e6) / 32 / 8)


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 0.99, 0.999])
def test_sparsity_predicts_what_the_fraction_sent_gives(sparsity: float) -> None:
    """``Options(sparsity=s)`` sends ``1 - s`` of the matrices' coordinates: bytes and step
    times equal the ones written out by hand from the kept counts (the last float digit may
    differ: ``1 - 0.99`` is not exactly ``0.01``)."""
    n, vec, world = 1.8e9, 2e6, 32
    w = S.Workload(params=n, vector_params=vec, compute_s=1.0)
    c = S.Cluster(world=world, inter=S.Link(0.0, 25e9))
    sent = {0.0: 1.0, 0.5: 0.5, 0.9: 0.1, 0.99: 0.01, 0.999: 0.001}[sparsity]
    kept = sent * (n - vec) + vec
    r = S.predict(w, c, S.Options(sparsity=sparsity))
    assert S.kept(w, sparsity) == pytest.approx(kept, rel=1e-12)
    assert r["scape_value_bytes_per_gpu"] == pytest.approx(4 * kept, rel=1e-12)
    owned = (n - vec) / world
    assert r["scape_mask_bytes_per_gpu"] == pytest.approx(min(4 * sent * owned, owned / 8),
                                                          rel=1e-12)
    assert r["scape"]["values_s"] == pytest.approx(2 * (world - 1) / world * 4 * kept / 25e9,
                                                   rel=1e-12)
    assert r["options"]["sparsity"] == sparsity and "density" not in r["options"]


@pytest.mark.parametrize("bad", [1.0, 1.5, -0.1, float("nan")])
def test_bad_sparsity_is_one_line_naming_it(bad: float) -> None:
    with pytest.raises(ParameterError) as err:
        S.Options(sparsity=bad)
    msg = str(err.value)
    assert msg == f"sparsity = {bad!r}: must be in [0, 1)" and "\n" not in msg


def test_overlap_hides_the_mask_and_without_it_the_step_grows() -> None:
    w = S.Workload(params=1e9, compute_s=1.0)
    c = S.Cluster(inter=S.Link(0.0, 1e8))
    on = S.scape_step(w, c, S.Options(sparsity=0.9, overlap_mask=True))
    off = S.scape_step(w, c, S.Options(sparsity=0.9, overlap_mask=False))
    assert off["step_s"] - on["step_s"] == pytest.approx(min(on["mask_s"], 1.0))


def test_an_overlapped_reduction_hides_behind_the_last_micro_batch_only() -> None:
    c = S.Cluster(inter=S.Link(0.0, 1e9))
    o = S.Options(overlap_dense=True)
    one = S.dense_step(S.Workload(params=1e9, compute_s=3.0), c, o)
    eight = S.dense_step(S.Workload(params=1e9, compute_s=3.0, micro_batches=8), c, o)
    assert one["exposed_comm_s"] == pytest.approx(max(0.0, one["comm_s"] - 2.0))
    assert eight["exposed_comm_s"] == pytest.approx(eight["comm_s"] - 2.0 / 8)
    with pytest.raises(ParameterError, match="micro_batches"):
        S.Workload(params=1e9, micro_batches=0)


def test_the_network_rate_is_per_node_and_nics_add_up() -> None:
    w = S.Workload(params=1e9, compute_s=1.0)
    intra = S.Link(0.0, 150e9)
    one = S.Cluster(world=32, gpus_per_node=4, inter=S.Link(0.0, 25e9), intra=intra)
    four = S.Cluster(world=32, gpus_per_node=4, inter=S.Link(0.0, 25e9), intra=intra,
                     nics_per_node=4)
    assert S.all_reduce_s(4e9, one) == pytest.approx(2 * 31 / 32 * 4e9 / 25e9)
    assert S.all_reduce_s(4e9, four) == pytest.approx(S.all_reduce_s(4e9, one) / 4)
    # 4 GPUs behind one NIC move no more bytes per second than 1 GPU per node
    single = S.Cluster(world=32, gpus_per_node=1, inter=S.Link(0.0, 25e9))
    assert S.dense_step(w, one, S.Options())["comm_s"] == pytest.approx(
        S.dense_step(w, single, S.Options())["comm_s"])
    with pytest.raises(ParameterError, match="nics_per_node"):
        S.Cluster(nics_per_node=0)


def test_the_selection_cost_adds_to_scape_only() -> None:
    w = S.Workload(params=1e9, compute_s=1.0)
    c, o = S.Cluster(), S.Options(sparsity=0.99)
    base = S.LocalWork.from_hbm(4e12)
    per_param = S.LocalWork.from_hbm(4e12, selection_s_per_param=1e-10)
    per_step = S.LocalWork.from_hbm(4e12, selection_s_per_step=0.3)
    b = S.predict(w, c, o, base)
    assert S.predict(w, c, o, per_param)["scape_step_s"] == pytest.approx(b["scape_step_s"] + 0.1)
    assert S.predict(w, c, o, per_step)["scape_step_s"] == pytest.approx(b["scape_step_s"] + 0.3)
    assert S.predict(w, c, o, per_step)["dense_step_s"] == b["dense_step_s"]


def test_wallclock_with_dense_warmup_saves_less_than_the_step() -> None:
    m = P.LLAMA_500M
    c = P.paper_cluster(25.0)
    o = S.Options(sparsity=0.99)
    per_step = 1 - 1 / S.predict(m.workload(), c, o)["speedup"]
    whole = S.run_wallclock(m.workload(), c, o, m.total_steps, m.dense_steps, m.ramp_steps)
    assert 0 < whole["saving"] < per_step
    assert S.run_wallclock(m.workload(), c, o, 100)["saving"] == pytest.approx(per_step)


def test_weak_scaling_efficiency_is_one_at_the_smallest_world() -> None:
    rows = P.scaling_table()
    assert [r["world"] for r in rows] == [8, 32, 128]
    assert rows[0]["dense_efficiency"] == rows[0]["scape_efficiency"] == 1.0
    assert all(r["scape_efficiency"] >= r["dense_efficiency"] for r in rows)


def test_required_bandwidth_gives_the_target_speedup() -> None:
    g = P.required_bandwidth(P.LLAMA_1_8B, 2.0)
    assert g is not None
    c = P.paper_cluster(g)
    o = S.Options(sparsity=P.LLAMA_1_8B.sparsity)
    assert S.predict(P.LLAMA_1_8B.workload(), c, o)["speedup"] == pytest.approx(2.0, rel=1e-4)


def test_cli_contract_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["predict", "--model-params", "1.8e9", "--world-size", "32", "--gpus-per-node",
               "4", "--inter-node-gbit", "200", "--sparsity", "0.99", "--json"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    r = json.loads(out[0])
    assert {"dense_step_s", "scape_step_s", "speedup"} <= set(r)
    assert r["speedup"] == pytest.approx(r["dense_step_s"] / r["scape_step_s"])
    assert r["cluster"]["gpus_per_node"] == 4 and r["cluster"]["inter_node_gbit"] == 200


def _predict_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["predict", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_default_model_is_llama_1_8b_counted_from_its_shape(
        capsys: pytest.CaptureFixture[str]) -> None:
    r = _predict_json(capsys)
    n, vec = P.LLAMA_1_8B.params()
    assert r["workload"]["params"] == n > 2.3e9 and r["workload"]["vector_params"] == vec
    assert r["workload"]["flops_per_token"] == P.LLAMA_1_8B.workload().flops_per_token


def test_measured_compute_and_bus_bandwidth_replace_the_assumptions(
        capsys: pytest.CaptureFixture[str]) -> None:
    r = _predict_json(capsys, "--paper-model", "Llama-500M", "--compute-s", "0.9",
                      "--allreduce-busbw-gbyte", "3.5", "--inter-node-latency-us", "0")
    n = P.LLAMA_500M.params()[0]
    assert r["dense"]["compute_s"] == 0.9
    # nccl-tests' busbw is size / time x 2 (p-1)/p: the ring's time is 2 (p-1)/p n / busbw
    assert r["dense"]["comm_s"] == pytest.approx(2 * 31 / 32 * 4 * n / 3.5e9)
    two = _predict_json(capsys, "--paper-model", "Llama-500M", "--compute-s", "0.9",
                        "--allreduce-busbw-gbyte", "3.5", "--inter-node-latency-us", "0",
                        "--nics-per-node", "2")
    assert two["dense"]["comm_s"] == pytest.approx(r["dense"]["comm_s"])   # per node: the same
    assert r["inputs"]["measured"] == ["compute-s", "allreduce-busbw-gbyte"]


def test_ranges_give_an_interval_and_the_multiplier_the_time_to_the_same_loss(
        capsys: pytest.CaptureFixture[str]) -> None:
    r = _predict_json(capsys, "--mfu", "0.35:0.6", "--inter-node-gbit", "100:400",
                      "--steps-multiplier", "1.1:1.3")
    corners = [_predict_json(capsys, "--mfu", m, "--inter-node-gbit", g)["speedup"]
               for m in ("0.35", "0.6") for g in ("100", "400")]
    assert r["speedup_interval"] == pytest.approx([min(corners), max(corners)])
    assert min(corners) < r["speedup"] < max(corners)
    assert r["time_to_loss_ratio"] == pytest.approx(r["speedup"] / 1.2)
    assert r["time_to_loss_interval"] == pytest.approx([min(corners) / 1.3, max(corners) / 1.1])


def test_at_the_break_even_rate_scape_and_dense_take_as_long(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--paper-model", "Llama-500M", "--sparsity", "0.9", "--selection-s-per-step", "0.2"]
    even = _predict_json(capsys, *base)["break_even_gbit_per_node"]
    assert even is not None and 10 < even < 1e4
    assert _predict_json(capsys, *base, "--inter-node-gbit", f"{even!r}")["speedup"] == \
        pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("argv,flag", [(["--mfu", "0.6:0.3"], "--mfu"),
                                       (["--compute-s", "a"], "--compute-s"),
                                       (["--inter-node-gbit", "200", "--allreduce-busbw-gbyte",
                                         "3"], "--allreduce-busbw-gbyte"),
                                       (["--steps-multiplier", "0"], "--steps-multiplier")])
def test_a_bad_range_or_measured_input_is_one_error_naming_the_flag(argv: list[str],
                                                                   flag: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "lmrepro", "predict", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert flag in last and "must" in last


@pytest.mark.parametrize("argv,name", [(["--sparsity", "1.5"], "--sparsity"),
                                       (["--sparsity", "1"], "--sparsity"),
                                       (["--world-size", "0"], "--world-size"),
                                       (["--inter-node-gbit", "-1"], "--inter-node-gbit"),
                                       (["--world-size", "30", "--gpus-per-node", "4"],
                                        "--world-size"),
                                       (["--mfu", "2"], "--mfu")])
def test_bad_flag_exits_2_with_one_line(argv: list[str], name: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "lmrepro", "predict", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in proc.stderr
    assert "must be" in lines[0]


def test_the_old_density_flag_is_an_argparse_error_naming_sparsity() -> None:
    proc = subprocess.run([sys.executable, "-m", "lmrepro", "predict", "--density", "0.01"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "error: --density was removed: use --sparsity" in last
    assert "--density" not in subprocess.run(
        [sys.executable, "-m", "lmrepro", "predict", "--help"], capture_output=True,
        text=True).stdout


def _synthetic_links(alpha: float, beta: float, s: float, form: str = "serial"
                     ) -> list[dict]:
    sizes = [65536 * 4 ** i for i in range(5)]
    links = []
    for rate in (None, 1000.0, 100.0, 10.0):
        inv = 0.0 if rate is None else 8.0 / (rate * 1e6)
        per = beta + s * inv if form == "serial" else max(beta, s * inv)
        times = {k: [[alpha + n * per] * 3 for n in sizes] for k in F.KINDS}
        links.append({"rate_mbit": rate, "sweep_sizes": sizes, "sweep_times_s": times})
    return links


def test_fit_recovers_known_alpha_beta() -> None:
    m = F.fit_link_model(_synthetic_links(2e-4, 1e-9, 2.0), "all_reduce", form="serial")
    assert m["alpha_s"] == pytest.approx(2e-4, rel=1e-6)
    assert m["beta_mem_s_per_byte"] == pytest.approx(1e-9, rel=1e-6)
    assert m["link_bytes_per_byte"] == pytest.approx(2.0, rel=1e-6)
    assert F.collective_s(m, 1e6, 1e8) == pytest.approx(2e-4 + 1e6 * (1e-9 + 16 / 1e8))


def test_the_overlapped_form_recovers_its_constants_and_takes_the_larger_cost() -> None:
    # beta 3e-8 s/B exceeds the 1000 Mbit/s link's 2 * 8e-9: that link is memory-bound
    links = _synthetic_links(2e-4, 3e-8, 2.0, form="overlapped")
    m = F.fit_link_model(links, "all_reduce")
    assert m["form"] == "overlapped" and m["max_rel_err"] < 1e-9
    assert m["beta_mem_s_per_byte"] == pytest.approx(3e-8, rel=1e-6)
    assert m["link_bytes_per_byte"] == pytest.approx(2.0, rel=1e-6)
    assert F.collective_s(m, 1e6, 1e9) == pytest.approx(2e-4 + 1e6 * 3e-8)        # memory
    assert F.collective_s(m, 1e6, 1e8) == pytest.approx(2e-4 + 1e6 * 16 / 1e8)    # link
    # the serial form cannot fit these points exactly
    assert F.fit_link_model(links, "all_reduce", form="serial")["max_rel_err"] > 0.05
    with pytest.raises(ValueError, match="form"):
        F.fit_link_model(links, "all_reduce", form="sum")


@pytest.mark.skipif(not BENCH.exists(), reason="no benchmark result")
def test_held_out_prediction_on_the_bench_results_is_computed() -> None:
    results = json.loads(BENCH.read_text())
    cal = F.calibrate(results)
    held = [r for r in cal["rows"] if r["role"] == "held-out"]
    assert held and cal["held_out_links"] and set(cal["fit_links"]).isdisjoint(
        cal["held_out_links"])
    for r in held:       # recomputed from the raw timings, not a stored figure
        link = results["links"][r["link"]]
        run = next(x for x in link["raw_runs"] if x["method"] == r["method"]
                   and x["mode"] == "real")
        assert r["measured_s"] == pytest.approx(float(np.median(run["block_step_s"])))
        assert r["q1_s"] <= r["measured_s"] <= r["q3_s"]
        assert r["rel_error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        assert math.isfinite(r["predicted_s"]) and r["timed_steps"] > 0
    # holding out another link changes the fit, so the prediction is not a stored number
    other = F.calibrate(results, holdout=["100mbit"])
    assert other["models"] != cal["models"]


def test_steptime_report_writes_its_products_and_says_when_not_calibrated(tmp_path: Path) -> None:
    """The page's stage (notebooks/09_steptime.ipynb): every product written; without the
    calibration run it says "not yet calibrated" and shows the development check; the paper
    rows and the plot come from the model, with the paper's figures beside them."""
    import shutil

    from lmrepro.scape.steptime import report as R

    # no benchmark result at all: not calibrated, no table
    empty = R.load_calibration(tmp_path / "none")
    assert empty is None and "Not yet calibrated" in R.calibration_note(empty)
    assert R.calibration_frame(empty).empty
    bench = tmp_path / "bench"
    bench.mkdir()
    if BENCH.exists():
        shutil.copy(BENCH, bench / R.DEVELOPMENT)
    out = R.steptime_stage(bench, tmp_path / "results/steptime")
    assert sorted(p.name for p in (tmp_path / "results/steptime").iterdir()) == sorted(R.OUTPUTS)
    # and its headline metrics beside results/, as the pipeline's metrics/steptime
    assert sorted(p.stem for p in (tmp_path / "metrics/steptime").glob("*.json")) == [
        "step-speedup", "step-speedup-of-paper", "wall-clock-saving",
        "wall-clock-saving-of-paper"]
    if BENCH.exists():
        assert "Not yet calibrated" in out["calibration_note"]
        assert "development check" in out["calibration_note"]
        assert not out["tables"]["calibration"].empty
    head = out["tables"]["headline"]
    assert list(head.paper_figure) == [f"{P.PAPER_STEP_SPEEDUP}x", f"{P.PAPER_WALL_SAVING:.1%}"]
    assert head.required_gbit.iloc[0] == pytest.approx(
        P.required_bandwidth(P.LLAMA_1_8B, P.PAPER_STEP_SPEEDUP))
    scaling = out["tables"]["scaling"]
    assert sorted(set(scaling.world)) == [8, 32, 128]
    curves = out["curves"]
    assert set(curves.sparsity) == {0.9, 0.99} and curves.model.nunique() == 4
    # faster networks leave SCAPE less to save (not strictly monotone: on the slowest links the
    # mask all-gather no longer hides behind compute), and at the fastest it no longer pays
    for _, g in curves.groupby(["model", "sparsity"]):
        s = g.sort_values("inter_node_gbit").speedup.to_numpy()
        assert s[0] > 5 * s[-1] and s[-1] < 1.0
    fig = out["figures"]["speedup_vs_bandwidth"]
    assert len(fig.axes) == 2 and all(ax.get_xscale() == "log" for ax in fig.axes)
    saved = json.loads((tmp_path / "results/steptime/predictions.json").read_text())
    assert saved["paper_figures"]["step_speedup"] == P.PAPER_STEP_SPEEDUP
    # with the calibration run present it is used and called calibrated
    if BENCH.exists():
        shutil.copy(BENCH, bench / R.CALIBRATION)
        cal = R.load_calibration(bench)
        assert cal is not None and cal["calibrated"]
        assert R.calibration_note(cal).startswith("Calibrated on")
