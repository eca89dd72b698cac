"""SCAPE's training-length study (lmrepro.scape.study.scaling and study.report), the n-gram floor
(lmrepro.data.ngram), profile selection by LMREPRO_PROFILE and the README section a published
study writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from lmrepro.data import ngram
from lmrepro.errors import ConfigError, ParameterError
from lmrepro.pipeline.params import load_params
from lmrepro.stats import StatsConfig

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# the n-gram floor
# ---------------------------------------------------------------------------------------------

def test_bigram_add_k_is_the_lidstone_formula() -> None:
    train = np.frombuffer(b"abababababac", dtype=np.uint8)
    c = ngram.counts(train)
    seq = np.frombuffer(b"xabc", dtype=np.uint8)     # scored: b after a, c after b
    terms = ngram._terms(c, seq)
    k = 0.5
    n_ab, n_a = 5, 6       # "ab" five times; "a" six times, five followed by b, one by c
    n_bc, n_b = 0, 5
    expected = -(math.log2((n_ab + k) / (n_a + 256 * k))
                 + math.log2((n_bc + k) / (n_b + 256 * k))) / 2
    assert ngram.bigram_bpb(terms, k) == pytest.approx(expected)


def test_a_periodic_text_is_almost_free_for_the_trigram_table() -> None:
    train = np.frombuffer(b"abc" * 2000, dtype=np.uint8)
    val = np.frombuffer(b"abc" * 100, dtype=np.uint8)
    f = ngram.floors(train, val, val)
    assert f["trigram"]["val"] < 0.1 < 1.0 < 8.0
    noise = np.random.default_rng(0).integers(0, 256, 26000).astype(np.uint8)
    g = ngram.floors(noise[:20000], noise[20000:23000], noise[23000:])
    assert g["bigram"]["val"] > 7.0          # uniform bytes: about 8 bits, nothing to learn


def test_the_floor_is_kept_beside_the_corpus_and_recomputed_when_it_changes(
        tmp_path: Path) -> None:
    from lmrepro.data.prepare import prepare_corpus

    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 400)
    prepare_corpus(raw, tmp_path / "c")
    first = ngram.corpus_floor(tmp_path / "c")
    assert (tmp_path / "c" / ngram.FLOOR_FILE).exists()
    assert ngram.corpus_floor(tmp_path / "c") == first
    raw.write_bytes(b"pack my box with five dozen liquor jugs! " * 400)
    prepare_corpus(raw, tmp_path / "c")
    assert ngram.corpus_floor(tmp_path / "c")["splits"] != first["splits"]


def test_testable_needs_ten_percent_below_the_trigram_floor() -> None:
    assert ngram.testable(2.69, 3.0) and not ngram.testable(2.71, 3.0)
    assert not ngram.testable(float("nan"), 3.0)


# ---------------------------------------------------------------------------------------------
# the study's configuration
# ---------------------------------------------------------------------------------------------

def _study_raw() -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return raw["profiles"]["scaling"]["scape"]["scaling"]


@pytest.mark.parametrize("change, fragment", [
    (lambda s: s["lengths"].update({"2x64": [1000, 300]}), "lengths.2x64"),
    (lambda s: s.update(verdict_size="huge"), "verdict_size"),
    (lambda s: s["ablations"][0].update(run="nope"), "ablations[0].run"),
    (lambda s: s.update(sweep_seed=0), "sweep_seed"),
    (lambda s: s.update(sweep_factors=[1.0, 2.0]), "sweep_factors"),
    (lambda s: s["seeds"].pop("4x128"), "seeds"),
])
def test_a_bad_study_is_refused_naming_the_key(change, fragment: str) -> None:
    from lmrepro.scape.config import ScalingStudy

    raw = _study_raw()
    change(raw)
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        ScalingStudy(**raw)


def _mechanism_raw() -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return raw["profiles"]["mechanism"]["scape"]["scaling"]


@pytest.mark.parametrize("change, fragment", [
    (lambda s: s.update(sweep_runs=["scape90", "nope"]), "sweep_runs"),
    (lambda s: s["contrasts"][0].update(baseline="nope"), "contrasts[0]"),
    (lambda s: s["runs"]["2x64"][0].update(off_mask_momentum="zero"), "off_mask_momentum"),
    (lambda s: s["runs"]["2x64"][0].update(dense_steps=10), "dense_steps"),
    (lambda s: s["runs"]["2x64"][4].update(mask_rule="stale_m"), "off_mask_momentum"),
])
def test_a_bad_mechanism_study_is_refused_naming_the_key(change, fragment: str) -> None:
    from lmrepro.scape.config import ScalingStudy

    raw = _mechanism_raw()
    ScalingStudy(**raw)
    change(raw)
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        ScalingStudy(**raw)


def test_a_runs_own_dense_steps_and_momentum_rule_reach_its_worker() -> None:
    """A study run's dense steps travel as the section's --dense-steps; the momentum rule is
    the method's own unless the run sets it."""
    import argparse

    from lmrepro.config import from_arguments
    from lmrepro.model import ModelConfig
    from lmrepro.scape import cli
    from lmrepro.scape.train import worker
    from lmrepro.scape.config import ScapeConfig, ScapeRun

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    runs = {r["name"]: ScapeRun(**r) for r in _mechanism_raw()["runs"]["2x64"]}
    cfg = ScapeConfig(steps=10, dense_steps=3)
    for name, dense, rule in (("scape90", 3, "zero"), ("scape90_dense", 500, "zero"),
                              ("scape90_keepm", 3, "decay"), ("topk99", 3, "decay"),
                              ("topk99_zerom", 3, "zero")):
        run = runs[name]
        args = parser.parse_args(["train-scape", *worker.worker_argv(cfg, run, ModelConfig(), "c",
                                                                  "o", seed=0)])
        got_cfg = from_arguments(ScapeConfig, args)
        got_run = from_arguments(ScapeRun, args, exclude=worker.RUN_OWN)
        assert got_cfg.dense_steps == dense and got_cfg.lr == run.lr, name
        assert got_run.momentum_rule == rule and got_run.off_mask_momentum == \
            run.off_mask_momentum, name


def test_an_unset_knob_leaves_the_identity_of_runs_made_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's knob left unset (None: the method's own behaviour) is not in its point's
    identity, so a knob added later keeps the runs made before it; a set knob is."""
    from lmrepro.scape.config import ScalingStudy, ScapeConfig, ScapeRun
    from lmrepro.scape.study import scaling

    monkeypatch.setattr(scaling, "data_identity", lambda *a: {})
    study = scaling.ScapeStudy(ScalingStudy(**_mechanism_raw()), ScapeConfig(steps=10),
                               "shakespeare", 2, tmp_path, tmp_path)
    plain = ScapeRun(name="scape90", optimizer="scape", sparsity=0.9, lr=0.004)
    keepm = plain.replace(off_mask_momentum="decay")
    got = study._identity("2x64", [plain, keepm], ScapeConfig(steps=10))["runs"]
    assert got[0] == {"name": "scape90", "optimizer": "scape", "sparsity": 0.9, "lr": 0.004,
                      "mask_rule": "ef_momentum", "topk_inner": "adams", "decay_scope": "all"}
    assert got[1]["off_mask_momentum"] == "decay" and "dense_steps" not in got[1]


def test_warm_ups_scale_with_the_run() -> None:
    from lmrepro.scape.config import ScapeConfig
    from lmrepro.scape.study.scaling import scaled_settings

    s = scaled_settings(ScapeConfig(), 3000, 0.05, 0.1)
    assert (s.steps, s.warmup_steps, s.sparsity_warmup_steps) == (3000, 150, 300)
    assert scaled_settings(ScapeConfig(), 300, 0.05, 0.1).sparsity_warmup_steps == 30


def test_the_profile_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMREPRO_PROFILE", "scaling")
    p = load_params(ROOT / "params.yaml")
    assert p.profile == "scaling" and p.scape.scaling is not None
    assert load_params(ROOT / "params.yaml", "smoke").profile == "smoke"   # the argument wins
    monkeypatch.setenv("LMREPRO_PROFILE", "nope")
    with pytest.raises(ParameterError, match="profile = 'nope'"):
        load_params(ROOT / "params.yaml")
    monkeypatch.delenv("LMREPRO_PROFILE")
    assert load_params(ROOT / "params.yaml").profile == "default"


# ---------------------------------------------------------------------------------------------
# a tiny study, end to end (torchrun, 2 gloo workers)
# ---------------------------------------------------------------------------------------------

TINY = {"n_layers": 1, "d_model": 16, "n_heads": 2, "context": 16, "mlp_ratio": 2,
        "dropout": 0.0, "tie_embeddings": False}


@pytest.mark.timeout(600)
def test_a_tiny_study_runs_resumes_and_is_analysed(tmp_path: Path) -> None:
    from lmrepro.data.prepare import prepare_corpus
    from lmrepro.scape.config import ScapeSuite
    from lmrepro.scape.study.scaling import run_study
    from lmrepro.pipeline.length_study import README_SECTION
    from lmrepro.scape.study.report import write_analysis

    text = (ROOT / "data/embedded/shakespeare.txt").read_bytes()[:400_000]
    (tmp_path / "raw.txt").write_bytes(text)
    prepare_corpus(tmp_path / "raw.txt", tmp_path / "prepared" / "tiny")
    suite = ScapeSuite.model_validate({
        "corpus": "tiny", "world_size": 2, "batch_size": 2, "eval_batches": 3,
        "eval_batch_size": 4, "checkpoint_every": 0,
        "runs": [{"optimizer": "adams"}],
        "scaling": {
            "sizes": {"a": TINY}, "lengths": {"a": [2, 6]},
            "runs": {"a": [{"name": "adams", "optimizer": "adams", "lr": 0.002},
                           {"name": "scape90", "optimizer": "scape", "sparsity": 0.9,
                            "lr": 0.004}]},
            "seeds": {"a": [0]}, "verdict_size": "a", "verdict_seeds": [0, 1],
            "sweep_factors": [0.5, 1.0, 2.0], "sweep_seed": 7,
            "ablations": [{"name": "scape90_wdmask", "run": "scape90", "decay_scope": "mask"}],
            "ablation_seeds": [0]}})
    stage = tmp_path / "scaling"
    dirs = run_study(suite, None, tmp_path / "prepared", stage)   # type: ignore[arg-type]
    assert sorted(dirs) == sorted([f"a/L6/seed{s}/{r}" for s in (0, 1)
                                   for r in ("adams", "scape90")]
                                  + [f"a/L2/seed0/{r}" for r in ("adams", "scape90")]
                                  + ["ablation/a/L6/seed0/scape90_wdmask"])
    sweep = (stage / "sweep" / "sweep.json").read_text()
    assert '"best"' in sweep and len(list((stage / "sweep").glob("a/L6/seed7/*@lr*"))) == 6
    # the verdict point's runs use the sweep's winners, with warm-ups scaled to the run
    from lmrepro.results import read_summary

    s = read_summary(stage / "runs/a/L6/seed0/scape90")
    assert s.config["settings"]["sparsity_warmup_steps"] == round(0.1 * 6)
    assert s.details.final_test_bpb is not None
    before = {k: (v / "summary.json").stat().st_mtime_ns for k, v in dirs.items()}
    again = run_study(suite, None, tmp_path / "prepared", stage)   # type: ignore[arg-type]
    assert {k: (v / "summary.json").stat().st_mtime_ns for k, v in again.items()} == before

    from lmrepro.data.ngram import corpus_floor

    floors = {"tiny": corpus_floor(tmp_path / "prepared" / "tiny")}
    out = write_analysis(stage, tmp_path / "analysis", StatsConfig(n_resamples=200), ("a", 6),
                         floors, "tiny")
    gaps = out["tables"]["gaps"]
    row = gaps[(gaps.steps == 6) & (gaps.candidate == "scape90")].iloc[0]
    assert row.seeds == 2 and row.level == "seed" and not row.testable   # 6 steps: no floor
    assert row.lower <= row["mean"] <= row.upper
    assert set(out["tables"]["ablations"].against) == {"scape90", "adams"}
    assert "mask_kept" in out["tables"]["diagnostics"].columns
    assert out["records"].comparisons and all(c.split == "test"
                                              for c in out["records"].comparisons)
    section = (tmp_path / "analysis" / README_SECTION).read_text()
    assert "{published}/reports/11_analysis_scaling.html" in section and "| a | 6 |" in section
    # what the report shows: gaps as signed percentages under registered headers
    from lmrepro.pipeline.tables import format_table, sig3, signed
    from lmrepro.scape.study.report import DISPLAY, for_display

    for name in ("gaps", "ablations", "trend", "diagnostics"):
        if len(out["tables"][name]):    # (a 2-length study fits no trend)
            shown = format_table(for_display(name, out["tables"][name]))
            assert len(shown.columns) == len(DISPLAY[name]), name
    shown = format_table(for_display("gaps", gaps))
    assert shown.loc[0, "mean gap (%)"] == signed(sig3(100 * gaps["mean"].iloc[0]))
    assert set(shown["testable"]) <= {"yes", "no"}
    # when the runs finished, as their summaries record it: a copy or a checkout (a published
    # study restored on a fresh machine) resets the files' times but not this
    import os

    runs = out["tables"]["runs"]
    recorded = [json.loads((v / "summary.json").read_text())["finished_at"] for v in dirs.values()]
    assert runs.finished_at.max() == max(recorded)[:16] + "Z"
    for v in dirs.values():
        os.utime(v / "summary.json", (0, 0))
    reread = write_analysis(stage, tmp_path / "analysis2", StatsConfig(n_resamples=200), ("a", 6),
                            floors, "tiny")["tables"]["runs"]
    assert list(reread.finished_at) == list(runs.finished_at)
    assert f"runs (points and ablations) finished between {runs.finished_at.min()}" in section
    for png in ("gap_vs_length", "verdict_curves", "mask_diagnostics"):
        assert (tmp_path / "analysis" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_the_finish_window_counts_runs_that_predate_the_record() -> None:
    """Runs without a recorded finish time are counted, never dated by their files."""
    import pandas as pd

    from lmrepro.pipeline.length_study import finish_window

    both = pd.Series(["2026-12-04T10:00Z", None, "2026-12-06T01:01Z", None])
    assert finish_window(both) == ("finished between 2026-12-04T10:00Z and 2026-12-06T01:01Z "
                                   "(UTC; 2 trained before runs recorded their finish time)")
    assert finish_window(both.dropna()).endswith("2026-12-06T01:01Z (UTC)")
    assert finish_window(pd.Series([None, None])) == ("were trained before runs recorded their "
                                                      "finish time")


def test_publishing_a_study_fills_its_readme_section(tmp_path: Path) -> None:
    from lmrepro.io import atomic_write_json
    from lmrepro.pipeline import sections as S

    pub = tmp_path / "published" / "scaling"
    (pub / "results/analysis/scaling").mkdir(parents=True)
    (pub / "results/analysis/scaling/readme_section.md").write_text(
        "Full report: [{published}/reports/x.html]({published}/reports/x.html)\n")
    atomic_write_json(pub / "reports/provenance.json",
                      {"git": {"commit": "abc", "dirty": False}, "generated_at": "now",
                       "machine": {"usable_cores": 2, "cpu_model": "CPU"}})
    begin, end = S.profile_markers("scaling")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{begin}\nold\n{end}\n\nrest\n")
    assert S.update_profile_section(readme, pub, "scaling", "published/scaling")
    text = readme.read_text()
    assert "old" not in text and "(published/scaling/reports/x.html)" in text
    assert "commit `abc`" in text and text.endswith("rest\n")
    assert not S.update_profile_section(readme, pub, "other", "x")


def test_the_gap_plot_legend_names_every_method_of_any_size() -> None:
    import pandas as pd

    from lmrepro.scape.study.plots import gap_vs_length

    rows = [{"size": size, "steps": steps, "candidate": cand, "baseline": "adams",
             "mean": 0.1, "lower": 0.05, "upper": 0.15}
            for size, cands in (("a", ("scape90", "topk99")), ("b", ("scape90",)))
            for cand in cands for steps in (10, 100)]
    fig = gap_vs_length(pd.DataFrame(rows))
    labels = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert set(labels) == {"scape90", "topk99", "1 % margin"}
