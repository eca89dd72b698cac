"""RGC's training-length study (lmrepro.rgc.study.scaling): its configuration, the run settings it
derives, the test split every run is scored on, resume and identity, and the pool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmrepro.errors import ConfigError
from lmrepro.results import read_summary
from lmrepro.rgc.config import RGCConfig, RGCSuite

TINY = {"model": {"n_layers": 4, "d_model": 16, "n_heads": 2, "context": 16}, "batch_size": 4,
        "micro_batches": 2, "eval_batches": 2, "eval_batch_size": 4, "steps": 4,
        "warmup_steps": 1, "checkpoint_every": 2, "cores": 2,
        "stages_per_worker": [2, 2]}


def _study(**over) -> dict:
    s = {"sizes": {"a": {"n_layers": 4, "d_model": 16, "n_heads": 2, "context": 16}},
         "lengths": {"a": [2, 4]},
         "runs": [{"name": "rgc", "executor": "sync", "lr": 0.003},
                  {"name": "rgc_stale1", "executor": "sync", "consensus_staleness": 1,
                   "lr": 0.003},
                  {"name": "backprop", "executor": "backprop", "lr": 0.003}],
         "seeds": {"a": [0]}, "verdict_size": "a", "verdict_seeds": [0, 1],
         "sweep_factors": [0.5, 1.0, 2.0], "sweep_seed": 1000, "parallel": 1}
    s.update(over)
    return s


def _suite(**over) -> RGCSuite:
    return RGCSuite(**TINY, corpora=["c"], executors=["sync", "backprop"],
                    scaling=_study(**over))


@pytest.mark.parametrize("over, fragment", [
    ({"lengths": {"a": [4, 2]}}, "lengths.a"),
    ({"lengths": {"b": [2]}}, "lengths"),
    ({"verdict_size": "b"}, "verdict_size"),
    ({"baseline": "adamw"}, "baseline"),
    ({"sweep_seed": 0}, "sweep_seed"),
    ({"sweep_factors": [1.0, 2.0]}, "sweep_factors"),
    ({"runs": [{"name": "x", "executor": "sync", "lr": 1e-3},
               {"name": "x", "executor": "backprop", "lr": 1e-3}], "baseline": "x"}, "runs"),
])
def test_a_bad_study_is_refused_naming_the_key(over: dict, fragment: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=fragment):
        _suite(**over)


def test_a_size_that_the_stage_cut_cannot_split_is_refused() -> None:
    with pytest.raises((ConfigError, ValueError), match=r"scaling\.sizes\.a"):
        _suite(sizes={"a": {"n_layers": 6, "d_model": 16, "n_heads": 2, "context": 16}})


def test_a_size_is_a_model_config_whose_own_rule_names_its_key_path() -> None:
    with pytest.raises(ConfigError) as ei:
        _suite(sizes={"a": {"n_layers": 4, "d_model": 16, "n_heads": 3, "context": 16}})
    assert "rgc.scaling.sizes.a.n_heads = 3: must divide d_model = 16" in str(ei.value)


def test_run_config_scales_the_warmup_and_sets_the_run() -> None:
    from lmrepro.rgc.study.scaling import run_config

    suite = _suite()
    study = suite.scaling
    assert study is not None
    stale = study.runs[1]
    cfg = run_config(suite.config, study.sizes["a"], stale, 1000, 0.05, 1)
    assert isinstance(cfg, RGCConfig)
    assert (cfg.steps, cfg.warmup_steps, cfg.checkpoint_every) == (1000, 50, 250)
    assert cfg.consensus_staleness == 1 and cfg.lr == 0.003
    assert cfg.single_process_threads == 1
    assert cfg.model == study.sizes["a"]          # the size is the run's whole model
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.context) == (4, 16, 16)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lmrepro.data.prepare import prepare_corpus

    root = tmp_path_factory.mktemp("prepared")
    raw = root / "raw.txt"
    raw.write_bytes(b"to be or not to be, that is the question; whether 'tis nobler. " * 300)
    prepare_corpus(raw, root / "c")
    return root


def test_the_study_sweeps_then_trains_every_point_scored_on_test(prepared: Path,
                                                                 tmp_path: Path) -> None:
    from lmrepro.rgc.study.scaling import scaling_stage

    suite = _suite()
    out = scaling_stage(suite, prepared, tmp_path / "st")
    sweep = json.loads((tmp_path / "st" / "sweep" / "sweep.json").read_text())
    assert len(sweep["rows"]) == 3 * 3 and set(sweep["best"]) == {"rgc", "rgc_stale1",
                                                                   "backprop"}
    # each winner on the grid's edge was trained once more one grid step beyond it
    edge = json.loads((tmp_path / "st" / "sweep" / "edge_check.json").read_text())
    assert [r["run"] for r in edge["rows"]] == sweep["on_edge"] and edge["rows"]
    for r in edge["rows"]:
        assert r["beyond_lr"] == pytest.approx(r["grid_lr"] * (2 if r["grid_lr"] == 0.006
                                                               else 0.5))
        assert r["beyond_is_better"] == (r["beyond_final_bpb"] < r["grid_bpb"])
    # verdict point (L4): every run at its sweep winner, seeds 0 and 1; L2: seed 0 only
    assert sorted(out) == sorted([f"a/L4/seed{s}/{r}" for r in ("rgc", "rgc_stale1",
                                                                  "backprop") for s in (0, 1)]
                                 + [f"a/L2/seed0/{r}" for r in ("rgc", "rgc_stale1",
                                                                "backprop")])
    for key, d in out.items():
        s = read_summary(d)
        assert s.details.final_test_bpb is not None and (d / "eval_losses_test.json").exists()
        if key.startswith("a/L4/"):
            assert s.config["settings"]["lr"] == sweep["best"][key.split("/")[3]]
        assert s.config["settings"]["consensus_staleness"] == (1 if "stale1" in key else 0)
        assert set(s.config) == {"model", "settings"}       # every trainer's layout
        assert "n_layers" in s.config["model"] and "n_layers" not in s.config["settings"]
    # staleness changes what is learned (the decoder's updates arrive a step late)
    a = json.loads((out["a/L4/seed0/rgc"] / "eval_losses.json").read_text())["losses"]
    b = json.loads((out["a/L4/seed0/rgc_stale1"] / "eval_losses.json").read_text())["losses"]
    assert a != b
    # a second call trains nothing (finished runs are kept) ...
    before = {k: (d / "summary.json").stat().st_mtime_ns for k, d in out.items()}
    scaling_stage(suite, prepared, tmp_path / "st")
    assert {k: (d / "summary.json").stat().st_mtime_ns for k, d in out.items()} == before
    # ... and a changed run (its sweep centre, so its grid) sets only its directories aside
    changed = _suite(runs=[*_study()["runs"][:2],
                           {"name": "backprop", "executor": "backprop", "lr": 0.0005}])
    out2 = scaling_stage(changed, prepared, tmp_path / "st")
    for key in ("a/L2/seed0/rgc", "a/L4/seed1/rgc_stale1"):
        assert (out2[key] / "summary.json").stat().st_mtime_ns == before[key]
    lr = read_summary(out2["a/L2/seed0/backprop"]).config["settings"]["lr"]
    assert lr in (0.00025, 0.0005, 0.001)
    assert list((tmp_path / "st" / "runs" / "a" / "L2").glob("seed0/backprop.kept-*"))
    assert not list((tmp_path / "st" / "runs" / "a" / "L2").glob("seed*/rgc.kept-*"))


def test_the_pool_trains_runs_two_at_a_time_with_the_same_results(prepared: Path,
                                                                   tmp_path: Path) -> None:
    from lmrepro.rgc.study.scaling import scaling_stage

    one = scaling_stage(_suite(sweep_factors=[], lengths={"a": [3]}), prepared, tmp_path / "1")
    two = scaling_stage(_suite(sweep_factors=[], lengths={"a": [3]}, parallel=2), prepared,
                        tmp_path / "2")
    assert sorted(one) == sorted(two)
    for k in one:
        assert json.loads((one[k] / "eval_losses_test.json").read_text()) == \
            json.loads((two[k] / "eval_losses_test.json").read_text())


def test_a_published_study_is_put_back_without_training(prepared: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """--restore-from: every run comes back from a published copy (only the files a
    publication keeps), nothing is trained, and the analysis reads the same losses; a run
    the publication lacks stops it with a one-line error naming the flag."""

    from lmrepro.errors import ParameterError
    from lmrepro.rgc.study import scaling
    from lmrepro.rgc.study.scaling import run_study

    suite = _suite(sweep_factors=[], lengths={"a": [3]})
    made = run_study(suite, prepared, tmp_path / "st")
    published = tmp_path / "published"
    for f in (tmp_path / "st").rglob("*"):
        if f.name in ("summary.json", "eval_losses.json", "eval_losses_test.json"):
            (published / f.relative_to(tmp_path / "st")).parent.mkdir(parents=True,
                                                                       exist_ok=True)
            shutil.copy(f, published / f.relative_to(tmp_path / "st"))

    def no_training(job: object) -> None:
        raise AssertionError("a restored study trains nothing")

    monkeypatch.setattr(scaling, "train_job", no_training)
    back = run_study(suite, prepared, tmp_path / "back", restore_from=published)
    assert sorted(back) == sorted(made)
    for k in made:
        assert read_summary(back[k]).final_bpb == read_summary(made[k]).final_bpb
        assert (back[k] / "eval_losses_test.json").read_bytes() == \
            (made[k] / "eval_losses_test.json").read_bytes()
    shutil.rmtree(published / "runs" / "a" / "L3" / "seed1" / "backprop")
    with pytest.raises(ParameterError, match="--restore-from"):
        run_study(suite, prepared, tmp_path / "again", restore_from=published)


def test_a_study_in_the_run_first_layout_is_moved_and_reused_and_restored_from(
        prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RGC studies were published run-first (``<point>/<run>/seed<N>``, one identity per
    run): a results folder in that layout is moved to ``seed<N>/<run>`` and every run reused
    (nothing trains, the same files), its analysis rows are those of the seed-first study, and
    a run-first publication restores a study as a seed-first one does."""
    from lmrepro.rgc.study import scaling
    from lmrepro.rgc.study.report import study_runs
    from lmrepro.rgc.study.scaling import run_study
    from _runs import run_first

    suite = _suite(lengths={"a": [3]})
    made = run_study(suite, prepared, tmp_path / "st")
    rows = study_runs(tmp_path / "st").drop(columns="path")
    files = {p.relative_to(tmp_path / "st"): p.read_bytes()
             for p in sorted((tmp_path / "st").rglob("*.json")) if p.name != "identity.json"}
    for point in (tmp_path / "st").glob("*/a/L3"):
        run_first(point)
    assert not (made["a/L3/seed0/rgc"] / "summary.json").exists()
    pd.testing.assert_frame_equal(study_runs(tmp_path / "st").drop(columns="path"), rows)
    published = tmp_path / "published"
    shutil.copytree(tmp_path / "st", published, ignore=shutil.ignore_patterns("*.pt"))

    def no_training(job: object) -> None:
        raise AssertionError("a study moved to the one layout trains nothing")

    monkeypatch.setattr(scaling, "train_job", no_training)
    again = run_study(suite, prepared, tmp_path / "st")
    assert again == made
    assert {p.relative_to(tmp_path / "st"): p.read_bytes()
            for p in sorted((tmp_path / "st").rglob("*.json"))
            if p.name != "identity.json"} == files
    back = run_study(suite, prepared, tmp_path / "back", restore_from=published)
    assert sorted(back) == sorted(made)
    for k in made:
        assert (back[k] / "eval_losses_test.json").read_bytes() == \
            (made[k] / "eval_losses_test.json").read_bytes()


def test_a_profile_without_a_study_writes_a_plan_saying_so(prepared: Path, tmp_path: Path
                                                          ) -> None:
    from lmrepro.rgc.study.scaling import scaling_stage

    suite = RGCSuite(**TINY, corpora=["c"], executors=["sync"])
    assert scaling_stage(suite, prepared, tmp_path / "st") == {}
    assert "no training-length study" in json.loads(
        (tmp_path / "st" / "plan.json").read_text())["note"]


def test_the_analysis_pairs_each_rgc_run_with_backprop_by_seed_on_the_test_split(
        prepared: Path, tmp_path: Path) -> None:
    from lmrepro.data.ngram import corpus_floor
    from lmrepro.pipeline.claims import merge_records
    from lmrepro.rgc.study.scaling import scaling_stage
    from lmrepro.rgc.study.report import write_analysis
    from lmrepro.stats import StatsConfig

    suite = _suite(sweep_factors=[], lengths={"a": [2, 3, 4]}, seeds={"a": [0, 1]})
    scaling_stage(suite, prepared, tmp_path / "st")
    assert suite.scaling is not None
    floor = corpus_floor(prepared / "c")
    got = write_analysis(tmp_path / "st", tmp_path / "an", StatsConfig(n_resamples=200),
                         suite.scaling, {"c": floor}, "c")
    gaps = got["tables"]["gaps"]
    assert sorted(zip(gaps.steps, gaps.candidate)) == sorted(
        (n, c) for n in (2, 3, 4) for c in ("rgc", "rgc_stale1"))
    assert set(gaps.baseline) == {"backprop"} and (gaps.seeds == 2).all()
    # the gap is the mean over seeds of the per-seed mean relative difference on test batches
    from lmrepro.pipeline.runs import load_run

    row = gaps[(gaps.steps == 4) & (gaps.candidate == "rgc")].iloc[0]
    per_seed = []
    for seed in (0, 1):
        b = load_run("b", tmp_path / "st" / "runs" / "a" / "L4" / f"seed{seed}" / "backprop")
        c = load_run("c", tmp_path / "st" / "runs" / "a" / "L4" / f"seed{seed}" / "rgc")
        per_seed.append(float(np.mean((np.array(c.test_losses) - np.array(b.test_losses))
                                      / np.array(b.test_losses))))
    assert row["mean"] == pytest.approx(np.mean(per_seed), rel=1e-6)
    assert row["lower"] < row["mean"] < row["upper"]
    assert row["trigram_floor"] == pytest.approx(floor["trigram"]["test"])
    trend = got["tables"]["trend"]
    assert set(trend.candidate) == {"rgc", "rgc_stale1"} and "extrapolated_gap_at" not in trend
    # the claims read the verdict point: lockstep RGC (sync) against backprop, 2 seeds
    rec = merge_records({"rgc_scaling": got["records"]})
    assert [(c.candidate_role, c.baseline_role, c.n_seeds) for c in rec.comparisons] == [
        ("rgc_sync", "backprop", 2)]
    assert rec.comparisons[0].split == "test"
    from lmrepro.pipeline.claims import claims_table

    row = claims_table(rec).set_index("id").loc["rgc-quality-length"]
    assert row["verdict"] != "not run" and "mean d" in row["measured"]
    # tiny models end far above the floor: no quality verdict
    assert row["verdict"] == "not testable at this scale"
    section = (tmp_path / "an" / "readme_section.md").read_text()
    assert "| a | 4 | rgc |" in section and "not extrapolated" in section
    assert {"gap_vs_length", "verdict_curves"} <= set(got["figures"])


def test_a_run_sets_its_own_horizon_and_a_run_that_cannot_be_is_refused() -> None:
    from lmrepro.rgc.study.scaling import run_config

    runs = [*_study()["runs"], {"name": "rgc_H2", "executor": "sync", "horizon": 2,
                                "consensus_staleness": 1, "lr": 0.003}]
    suite = _suite(runs=runs)
    study = suite.scaling
    assert study is not None
    h2 = run_config(suite.config, study.sizes["a"], study.runs[3], 1000, 0.05, 1)
    assert (h2.horizon, h2.consensus_staleness, h2.stage_gradient_delays) == (2, 1, [1, 1, 0, 0])
    assert run_config(suite.config, study.sizes["a"], study.runs[0], 1000, 0.05, 1).horizon == 1
    with pytest.raises(ConfigError, match=r"scaling\.runs\[3\] \(rgc_H5\).*horizon.*n_stages"):
        _suite(runs=[*runs[:3], {"name": "rgc_H5", "executor": "sync", "horizon": 5,
                                 "lr": 0.003}])
    # running ahead by 2 steps at the shortest length (2 steps): stage 0 would never learn
    with pytest.raises(ConfigError, match=r"scaling\.runs\[3\] \(rgc_H2\).*size a"):
        _suite(runs=[*runs[:3], {**runs[3], "consensus_staleness": 2}], lengths={"a": [2, 4]})


def test_a_run_sets_its_own_local_loss_weight_and_lambda_one_keeps_the_identity() -> None:
    """rgc_lambda's runs: lambda per run (null: the section's); lambda = 1 leaves the run's
    configuration, hence its directory's identity, as the runs trained before the setting; a
    weight that leaves stages untrained at the run's horizon is refused naming the run."""
    from lmrepro.rgc.study.scaling import run_config

    runs = [*_study()["runs"], {"name": "rgc_H4_lambda0", "executor": "sync", "horizon": 4,
                                "local_loss_weight": 0.0, "lr": 0.003},
            {"name": "rgc_H4", "executor": "sync", "horizon": 4, "lr": 0.003}]
    suite = _suite(runs=runs)
    study = suite.scaling
    assert study is not None
    zero = run_config(suite.config, study.sizes["a"], study.runs[3], 1000, 0.05, 1)
    one = run_config(suite.config, study.sizes["a"], study.runs[4], 1000, 0.05, 1)
    assert (zero.horizon, zero.local_loss_weight, zero.to_dict()["local_loss_weight"]) == \
        (4, 0.0, 0.0)
    assert one.local_loss_weight == 1.0 and "local_loss_weight" not in one.to_dict()
    assert {**zero.to_dict(), "local_loss_weight": 1.0} == {**one.to_dict(),
                                                            "local_loss_weight": 1.0}
    with pytest.raises(ConfigError, match=r"scaling\.runs\[3\] \(rgc_lambda0\).*"
                       r"local_loss_weight.*0 needs horizon = n_stages"):
        _suite(runs=[*runs[:3], {"name": "rgc_lambda0", "executor": "sync",
                                 "local_loss_weight": 0.0, "lr": 0.003}])


def test_the_frontier_puts_each_runs_gap_beside_the_benchmarks_throughput_at_its_h_and_s(
        prepared: Path, tmp_path: Path) -> None:
    """RGC at H = 1 and 2, lockstep and running ahead, against backprop: the frontier table
    reads each run's H and s from its summary and the benchmark's async/backprop ratio at the
    same (H, s); a pair the benchmark did not run has none."""

    from lmrepro.data.ngram import corpus_floor
    from lmrepro.rgc.study.scaling import scaling_stage
    from lmrepro.rgc.study.report import frontier_figure, frontier_table, write_analysis
    from lmrepro.stats import StatsConfig

    runs = [{"name": "rgc", "executor": "sync", "lr": 0.003},
            {"name": "rgc_H2", "executor": "sync", "horizon": 2, "lr": 0.003},
            {"name": "rgc_H2_stale1", "executor": "sync", "horizon": 2,
             "consensus_staleness": 1, "lr": 0.003},
            {"name": "backprop", "executor": "backprop", "lr": 0.003}]
    suite = _suite(runs=runs, sweep_factors=[], lengths={"a": [3]}, seeds={"a": [0, 1]})
    out = scaling_stage(suite, prepared, tmp_path / "st")
    assert read_summary(out["a/L3/seed0/rgc_H2_stale1"]).details.stage_gradient_delay == \
        [1, 1, 0, 0]
    got = write_analysis(tmp_path / "st", tmp_path / "an", StatsConfig(n_resamples=200),
                         suite.scaling, {"c": corpus_floor(prepared / "c")}, "c")
    front = got["tables"]["frontier"]
    assert list(zip(front.candidate, front.horizon, front.consensus_staleness)) == [
        ("rgc", 1, 0), ("rgc_H2", 2, 0), ("rgc_H2_stale1", 2, 1)]
    gaps = got["tables"]["gaps"].set_index("candidate")
    assert list(front["mean"]) == [gaps.loc[c, "mean"] for c in front.candidate]
    assert "frontier" in got["figures"]
    bench = {"config": {"model": {"n_layers": 8, "d_model": 128}}, "placement": [[0, 1], [2, 3]],
             "threads": [1, 1], "rows": {
                 "async": {"horizon": 1, "consensus_staleness": 0, "vs_backprop_same_cores": 1.18},
                 "async-H2-stale1": {"horizon": 2, "consensus_staleness": 1,
                                     "vs_backprop_same_cores": 1.106}}}
    runs_df = pd.DataFrame(got["tables"]["runs"])
    with_bench = frontier_table(runs_df, got["tables"]["gaps"], ("a", 3), bench)
    ratio = list(with_bench.tokens_per_s_vs_backprop)
    assert ratio[0] == 1.18 and np.isnan(ratio[1]) and ratio[2] == 1.106
    names = list(with_bench.benchmark_run)
    assert names[0] == "async" and pd.isna(names[1]) and names[2] == "async-H2-stale1"
    assert with_bench.benchmark_shape.iloc[0].startswith("8x128")
    frontier_figure(with_bench, "backprop")
    section = (tmp_path / "an" / "readme_section.md").read_text()
    assert "The frontier at the verdict point" in section and "| 2 | 1 | rgc_H2_stale1 |" in \
        section
