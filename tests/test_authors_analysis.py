"""What the authors' logs measured (lmrepro.scape.authors.analysis), the step-time model fitted
to them (lmrepro.scape.authors.fit) and the report section (lmrepro.scape.authors.report)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmrepro.errors import ParameterError
from lmrepro.scape.authors import analysis as A
from lmrepro.scape.authors import logs as L
from lmrepro.scape.authors import fit as F
from lmrepro.scape.steptime import paper as P
from lmrepro.scape.steptime.model import Cluster, Link, LocalWork, Options, predict


def _rows(run: str, method: str, world: int, its, ms, density=1.0, target=1.0, loss=None,
          start=math.nan) -> list[dict]:
    loss = loss if loss is not None else [3.0] * len(its)
    dens = density if isinstance(density, list) else [density] * len(its)
    return [{"repository": "o/r", "commit": "", "path": f"{run}.out", "run": run, "segment": 0,
             "model": "Llama-500M", "world_size": world, "method": method,
             "target_density": target, "clip_grad": 1.0, "micro_batches": 2,
             "start_iteration": start, "density": d, "iteration": i, "elapsed_ms": t,
             "lm_loss": lo, "grad_norm": 0.1, "val_loss": math.nan, "page_offset": 0}
            for i, t, d, lo in zip(its, ms, dens, loss)]


def _table() -> pd.DataFrame:
    dense = _rows("dense", "adams", 32, range(1, 9), [9000, 8000] + [2000, 2100, 2200] * 2,
                  start=0)
    # SCAPE: dense phase, two warm-up steps, then four at the target 0.1
    its = list(range(1, 9)) + [20, 21] + [40, 41, 42, 43]
    ms = [9000, 8000] + [2100] * 6 + [1800, 1800] + [1000, 1050, 1100, 1050]
    dens = [1.0] * 8 + [0.5, 0.5] + [0.1] * 4
    loss = [3.3] * 8 + [3.0] * 6
    return pd.DataFrame(dense + _rows("scape", "scape", 32, its, ms, dens, 0.1, loss, start=0))


def test_phases_and_the_steady_steps() -> None:
    df = A.label_phases(_table())
    assert df[df.run == "scape"].groupby("phase").size().to_dict() == {
        "dense phase": 8, "target": 4, "warm-up": 2}
    assert set(df[df.run == "dense"].phase) == {"dense"}
    # the first two steps after the logged start are dropped
    assert A.steady(_table()).groupby("run").iteration.min().to_dict() == {"dense": 3,
                                                                          "scape": 3}


def test_step_times_are_medians_with_their_iqr_per_phase() -> None:
    t = A.step_times(_table()).set_index(["run", "phase"])
    assert t.loc[("dense", "dense"), "median_s"] == pytest.approx(2.1)
    dq = np.quantile([2.0, 2.1, 2.2] * 2, [0.25, 0.75])
    assert t.loc[("dense", "dense"), ["q1_s", "q3_s"]].tolist() == pytest.approx(list(dq))
    assert t.loc[("scape", "target"), "median_s"] == pytest.approx(1.05)
    assert t.loc[("scape", "target"), "iterations"] == "40-43"
    assert t.loc[("scape", "warm-up"), "band"] == "0.50"


def test_speedup_is_the_ratio_of_medians_with_the_range_of_the_iqrs() -> None:
    s = A.speedups(_table())
    row = s[(s.phase == "target") & (s.baseline == "dense AdamS")].iloc[0]
    assert row.ratio == pytest.approx(2.1 / 1.05)
    q = np.quantile([1.0, 1.05, 1.1, 1.05], [0.25, 0.75])
    dq = np.quantile([2.0, 2.1, 2.2] * 2, [0.25, 0.75])
    assert (row.low, row.high) == pytest.approx((dq[0] / q[1], dq[1] / q[0]))
    own = s[(s.phase == "target") & (s.baseline == "its own dense phase")].iloc[0]
    assert own.ratio == pytest.approx(2.1 / 1.05)


def test_matched_loss_pairs_the_same_iterations() -> None:
    df = _table()
    df.loc[(df.run == "dense"), "lm_loss"] = 3.0
    m = A.matched_loss(df)
    assert m.iterations.tolist() == ["1-8"] and m.n.iloc[0] == 8
    assert m.rel_diff.iloc[0] == pytest.approx(0.1)


def test_the_logs_wall_clock_follows_the_density_line() -> None:
    # step = 1 + 1 * density exactly; dense 2.5 s; SCAPE's dense phase 2 s
    rows = _rows("d", "adams", 32, range(10, 20), [2500] * 10)
    dens = [1.0] * 5 + [0.8, 0.6, 0.4, 0.2, 0.1]
    rows += _rows("s", "scape", 32, range(10, 20), [2000] * 5 + [1000 + 1000 * d for d in
                                                                    dens[5:]], dens, 0.1)
    w = A.wall_from_logs(pd.DataFrame(rows), "Llama-500M", 32, 0.1, 100, 10, 20)
    assert (w["fit_a"], w["fit_b"]) == pytest.approx((1.0, 1.0))
    expect = 10 * 2.0 + 20 * (1 + 0.55) + 70 * 1.1
    assert w["saving"] == pytest.approx(1 - expect / 250) and not w["extrapolated"]
    assert A.wall_from_logs(pd.DataFrame(rows), "Llama-500M", 32, 0.01, 100, 10, 20)[
        "extrapolated"]


def test_coverage_knows_a_log_that_ends_before_its_target() -> None:
    df = _table()
    df = df[~((df.run == "scape") & (df.iteration > 21))]
    prov = {"files": [{"path": "scape.out", "total_chars": 20000,
                       "pages": [{"offset": 8000, "first_iteration": 1,
                                  "last_iteration": 21}]}]}
    c = A.coverage(df, prov).set_index("run")
    assert bool(c.loc["scape", "ends_before_target"]) and c.loc["scape", "log_end_read"]
    assert not c.loc["dense", "log_end_read"]
    assert c.loc["scape", "blocks"] == "1-8, 20-21"


def test_the_dense_fit_recovers_the_mfu_and_rate_that_made_the_steps() -> None:
    w = P.LLAMA_500M.workload()
    steps = {}
    for p in (4, 32):
        c = Cluster(world=p, inter=Link(F.ALPHA_S, 30e9 / 8), mfu=0.55)
        steps[p] = predict(w, c, Options(), LocalWork.from_hbm(F.HBM))["dense_step_s"]
    mfu, bps = F.fit_dense(steps, w)
    assert mfu == pytest.approx(0.55, rel=1e-9) and bps * 8 == pytest.approx(30e9, rel=1e-9)
    # a planted SCAPE overhead is recovered from a step at density ~1
    f = F.LogFit(mfu, bps * 8 / 1e9, 0.25, w.params)
    step = predict(w, f.cluster(), Options(sparsity=0.001), f.local())["scape_step_s"]
    assert F.overhead(step, 0.999, mfu, bps, w) == pytest.approx(0.25, rel=1e-9)
    with pytest.raises(ParameterError, match="dense step times"):
        F.fit_dense({4: 1.0, 32: 5.0}, w)     # faster on fewer ranks: no MFU <= 1 fits


def test_the_fit_to_the_authors_logs_reproduces_its_inputs_and_predicts_the_rest() -> None:
    df = L.load_vista_table()
    central, corners, inputs = F.fit_from_logs(df)
    h = F.held_out_frame(central, corners, inputs)
    fitted = h[h.role == "fitted"]
    assert np.allclose(fitted.predicted_s, fitted.measured_s, rtol=1e-9)
    held = h[h.role == "held out"]
    assert len(held) >= 3 and held.density.min() < 0.11
    # the held-out SCAPE steps are predicted, not fitted (their error is not zero)
    assert (held.rel_error.abs() > 0).all() and np.isfinite(held.rel_error).all()
    assert 0 < central.mfu <= 1 and 0 < central.gbit < 200 and central.overhead_s > 0
    p = F.paper_at(central, corners)
    assert (p.low <= p[["value_per_parameter", "value_per_step"]].min(axis=1) + 1e-12).all()
    assert (p.high >= p[["value_per_parameter", "value_per_step"]].max(axis=1) - 1e-12).all()
    # on Llama-500M itself the two overhead scalings agree
    same = p[p.model == "Llama-500M"]
    assert np.allclose(same.value_per_parameter, same.value_per_step)
    with pytest.raises(ParameterError, match="scaling"):
        central.local("per layer")


def test_the_section_takes_its_numbers_from_the_table(tmp_path: Path) -> None:
    from lmrepro.scape.authors import page as G
    from lmrepro.scape.authors import report as R

    ev = R.evidence()
    df = ev["table"]
    st = A.label_phases(A.steady(df))
    dense = st[(st.method == "adams") & (st.world_size == 32)].elapsed_ms.median() / 1e3
    target = st[(st.phase == "target") & (st.world_size == 32)].elapsed_ms.median() / 1e3
    assert ev["speedup"]["ratio"] == pytest.approx(dense / target)
    assert f"{dense / target:.2f}x per step" in R.measured_speed_text(ev)
    assert R.speed_text(ev).startswith("not measured in the authors' logs")
    out = G.authors_stage(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(G.OUTPUTS)
    support = out["tables"]["support"]
    assert list(support.claim)[:2] == ["per-step speedup", "whole-run wall-clock"]
    assert "no_clip_grad" in support.set_index("claim").loc["runs that stop early",
                                                           "what the logs measured"]


def _job(run: str, day: int, method: str, ms: list[float], density: float = 1.0) -> pd.DataFrame:
    """Steady rows of one job whose name ends with a Unix time on ``day``."""
    name = f"{run}_{day * 86400 + 100}"
    return pd.DataFrame({"model": "Llama-500M", "world_size": 32, "method": method, "run": name,
                         "path": name, "segment": 0, "target_density": density,
                         "density": density, "start_iteration": 0.0,
                         "iteration": range(10, 10 + len(ms)), "elapsed_ms": ms})


def test_allocation_speedups_pair_every_dense_job_with_every_scape_job_same_day_first() -> None:
    df = pd.concat([_job("dense", 20500, "adams", [2000.0] * 9),
                    _job("dense", 20504, "adams", [2400.0] * 9),
                    _job("scape", 20504, "scape", [1200.0] * 9, 0.1)], ignore_index=True)
    pairs = A.allocation_speedups(df, "Llama-500M", 32)
    assert list(pairs.days_apart) == [0.0, 4.0]
    assert list(pairs.ratio) == pytest.approx([2.0, 2000 / 1200])
    spread = A.allocation_spread(pairs)
    assert spread["same_day"] == pytest.approx(2.0) and spread["pairings"] == 2
    assert (spread["min"], spread["max"]) == pytest.approx((2000 / 1200, 2.0))
    assert np.isnan(A.allocation_day("llama2_500M_AdamS"))


def test_the_model_is_validated_out_of_sample_on_every_scape_point() -> None:
    v = F.validation_frame(L.load_vista_table())
    # every SCAPE point of the logs, the 4-rank one included, with its errors printed
    assert {4, 32} <= set(v.world_size) and len(v) >= 5
    assert np.isfinite(v[["dense_only_error", "loo_error"]].to_numpy()).all()
    # leaving a point out changes its overhead (so its error is out of sample)
    assert (v.loo_overhead_s != v.implied_overhead_s).all()
    lo, hi = F.validated_error(v)
    assert lo == v.loo_error.min() and hi == v.loo_error.max() and lo < 0 < hi
    p = F.with_validated_error(pd.DataFrame({"claim": ["per-step speedup", "whole-run saving"],
                                             "low": [3.0, 0.4], "high": [4.0, 0.5]}), (-0.1, 0.1))
    assert list(p.validated_low) == pytest.approx([2.7, 1 - 0.6 / 0.9])
    assert list(p.validated_high) == pytest.approx([4.4, 1 - 0.5 / 1.1])
