"""The timing history (lmrepro.pipeline.timing_history): sessions pooled with the session as the
unit (a t interval of the sessions' mean log ratios, never a bootstrap), only sessions of the
same suite on the same machine, entries recorded once per session, and the committed file
holding what the published profiles give."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats as sps

from lmrepro.errors import ParameterError
from lmrepro.io import read_json
from lmrepro.pipeline import analysis as A
from lmrepro.pipeline import timing_history as H
from lmrepro.pipeline.records import Machine
from lmrepro.pipeline.resources import run_halfwidth
from lmrepro.pipeline.runs import suite_identity, suite_key
from lmrepro.results import RunSummary
from lmrepro.rgc.roles import ROLE_BACKPROP, ROLE_RGC_ASYNC
from lmrepro.rundirs import collect_runs
from test_rgc_claims import records
from _runs import make_run

ROOT = Path(__file__).resolve().parents[1]
AMD = Machine(cpu_model="AMD EPYC", cores=2)
INTEL = Machine(cpu_model="Intel(R) Xeon(R) Processor", cores=2)
MODEL = {"n_layers": 8, "d_model": 160, "n_heads": 4, "context": 128, "mlp_ratio": 4,
         "dropout": 0.0, "tie_embeddings": False}
SETTINGS = {"batch_size": 16, "micro_batches": 4, "n_stages": 4, "stages_per_worker": [2, 2],
            "threads": [1, 1], "backprop_threads": None, "horizon": 1, "queue_size": 2,
            "consensus_staleness": 0, "cores": 2, "steps": 300, "lr": 0.003,
            "warmup_steps": 30, "eval_batches": None, "checkpoint_every": 50}


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------

def by_hand(units: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """exp of the mean of ``units`` and of its two-sided t interval, from scipy's t."""
    n = len(units)
    m = sum(units) / n
    s = math.sqrt(sum((u - m) ** 2 for u in units) / (n - 1))
    h = sps.t.ppf(0.5 + confidence / 2, n - 1) * s / math.sqrt(n)
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def test_sessions_are_the_unit_of_the_pooled_interval() -> None:
    sessions = [[1.075, 1.091, 1.020], [0.961, 1.127, 1.015], [1.143, 1.152, 1.159]]
    p = H.pool_sessions(sessions)
    means = [sum(math.log(x) for x in s) / len(s) for s in sessions]
    ratio, low, high = by_hand(means)
    assert (p.ratio, p.low, p.high) == pytest.approx((ratio, low, high), rel=1e-12)
    assert (p.sessions, p.seeds, p.basis, p.conclusive) == (3, 9, "sessions", False)
    # docs/statistics.md's figure for published/reference's three sessions
    assert (round(p.ratio, 2), round(p.low, 2), round(p.high, 2)) == (1.08, 0.94, 1.24)
    # the seeds of one session are not the unit: pooling them as 9 seeds would decide
    seeds = by_hand([math.log(x) for s in sessions for x in s])
    assert seeds[1] > 1 and p.low < 1


def test_a_session_weighs_the_same_whatever_its_seeds() -> None:
    p = H.pool_sessions([[1.2] * 10, [0.9]])
    assert p.ratio == pytest.approx(math.sqrt(1.2 * 0.9))
    assert p.seeds == 11 and p.sessions == 2
    _, low, high = by_hand([math.log(1.2), math.log(0.9)])
    assert (p.low, p.high) == pytest.approx((low, high))


@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_one_session_falls_back_to_its_seed_level_interval(confidence: float) -> None:
    ratios = [1.143, 1.152, 1.159]
    p = H.pool_sessions([ratios], confidence)
    logs = [math.log(x) for x in ratios]
    h = run_halfwidth(logs, confidence)
    m = sum(logs) / 3
    assert p.basis == "seeds" and p.sessions == 1 and p.seeds == 3
    assert (p.ratio, p.low, p.high) == pytest.approx((math.exp(m), math.exp(m - h),
                                                      math.exp(m + h)))
    assert p.conclusive          # 1.13x to 1.17x excludes 1
    one = H.pool_sessions([[1.5]])
    assert one.low is None and one.high is None and not one.conclusive
    assert one.ratio == pytest.approx(1.5)


def test_pooled_is_conclusive_iff_its_interval_excludes_one() -> None:
    assert H.pool_sessions([[1.20, 1.21], [1.25, 1.24], [1.22]]).conclusive
    assert H.pool_sessions([[0.80], [0.82], [0.81]]).conclusive
    assert not H.pool_sessions([[1.3], [0.8], [1.1]]).conclusive


@pytest.mark.parametrize("sessions, confidence, message", [
    ([], 0.95, "sessions"), ([[1.0], []], 0.95, "sessions"), ([[1.0, 0.0]], 0.95, "> 0"),
    ([[1.0, math.inf]], 0.95, "finite"), ([[1.0]], 1.0, "confidence")])
def test_bad_pooling_input_is_named(sessions: list, confidence: float, message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        H.pool_sessions(sessions, confidence)


# --------------------------------------------------------------------------------------------
# The suite's identity
# --------------------------------------------------------------------------------------------

def summary(method: str, executor: str, config: dict, threads: int = 2, processes: int = 1,
            corpus: str = "shakespeare", seed: int = 0) -> RunSummary:
    return RunSummary(name=executor, method=method, corpus=corpus, seed=seed, steps=300,
                      tokens=1, final_bpb=3.5, tokens_per_s=1.0, mean_step_time_s=1.0,
                      train_time_s=1.0, peak_rss_bytes=1, n_params=1, processes=processes,
                      threads=threads, details={"executor": executor}, config=config)


def key(config: dict, **kw) -> str:
    return suite_key(suite_identity(summary("rgc", "async", config, processes=2, **kw),
                                    summary("backprop", "backprop", config, **kw)))


def test_the_identity_is_what_decides_the_work_of_a_step() -> None:
    nested = {"model": MODEL, "settings": SETTINGS}
    base = key(nested)
    # learning-rate schedule, evaluation and checkpoint settings, the seed: the same suite
    same = {**SETTINGS, "lr": 0.1, "warmup_steps": 1, "eval_batches": 4, "checkpoint_every": 3}
    assert key({"model": MODEL, "settings": same}, seed=5) == base
    # the layouts of older summaries: threads_per_worker, and the flat RGC configuration
    # (which fixed dropout 0 and untied embeddings)
    old = {k: v for k, v in SETTINGS.items() if k != "threads"} | {"threads_per_worker": [1, 1]}
    assert key({"model": MODEL, "settings": old}) == base
    flat = {**{k: v for k, v in MODEL.items() if k not in ("dropout", "tie_embeddings")}, **old}
    assert key(flat) == base
    # the shape, the batch, the threads or the corpus: another suite
    for other in ({"model": {**MODEL, "d_model": 128}, "settings": SETTINGS},
                  {"model": MODEL, "settings": {**SETTINGS, "batch_size": 4}},
                  {"model": MODEL, "settings": {**SETTINGS, "threads": [2, 2]}},
                  {"model": MODEL, "settings": {**SETTINGS, "steps": 60}}):
        assert key(other) != base
    assert key(nested, threads=1) != base and key(nested, corpus="enwik8") != base


# --------------------------------------------------------------------------------------------
# Sessions of a record, and the claims' pooling
# --------------------------------------------------------------------------------------------

def entry(ratios: list[float], *, suite: str = "s", machine: Machine = AMD, profile: str = "p",
          commit: str = "c", date: str = "2026-12-01") -> H.HistoryEntry:
    return H.HistoryEntry(
        profile=profile, commit=commit, dirty=False, date=date, machine=machine, stage="rgc",
        label="rgc-async vs backprop (shakespeare)", corpus="shakespeare",
        candidate_role=ROLE_RGC_ASYNC, baseline_role=ROLE_BACKPROP, suite=suite,
        seeds=list(range(len(ratios))), candidate_tokens_per_s=[1000.0 * x for x in ratios],
        baseline_tokens_per_s=[1000.0] * len(ratios), throughput_ratios=ratios)


def record(ratios: list[float], suite: str | None = "s", machine: Machine | None = AMD):
    rec = records(tps=(1000.0 * sum(ratios) / len(ratios), 1000.0))
    r = rec.resources[0].model_copy(update={
        "suite": suite, "machine": machine, "timing_seeds": list(range(len(ratios))),
        "throughput_ratios": ratios})
    return rec.model_copy(update={"resources": [r]})


def test_only_the_suite_on_the_same_machine_pools_and_this_run_counts_once() -> None:
    history = H.TimingHistory(entries=[
        entry([1.06, 1.07], commit="a"), entry([1.03, 1.02], commit="b"),
        entry([0.33, 0.34], machine=INTEL, commit="d"),        # another machine
        entry([24.0, 74.5], suite="toy", commit="e")])         # a toy suite
    r = record([1.15, 1.16]).resources[0]
    assert H.sessions_of(r, history) == [[1.06, 1.07], [1.03, 1.02], [1.15, 1.16]]
    recorded = H.TimingHistory(entries=[*history.entries, entry([1.15, 1.16], commit="f")])
    assert H.sessions_of(r, recorded) == [[1.06, 1.07], [1.03, 1.02], [1.15, 1.16]]
    pooled = H.pool_records(record([1.15, 1.16]), history).resources[0].pooled_throughput
    assert pooled == H.pool_sessions([[1.06, 1.07], [1.03, 1.02], [1.15, 1.16]])
    # an older record (no suite, no machine) is left as it was
    old = record([1.15, 1.16], suite=None, machine=None)
    assert H.pool_records(old, history) == old


def test_runs_reused_from_another_machine_pool_with_that_machines_sessions() -> None:
    """A record of runs the history holds from another machine (reused by a republication
    analysed here) is placed on the machine that timed them and pooled with its sessions."""
    history = H.TimingHistory(entries=[
        entry([0.33, 0.34], machine=INTEL, commit="d"), entry([1.06, 1.07], commit="a")])
    r = record([0.33, 0.34]).resources[0]                   # analysed on the AMD machine
    assert r.machine == AMD and H.timed_on(r, history) == INTEL
    (pooled,) = H.pool_records(record([0.33, 0.34]), history).resources
    assert pooled.machine == INTEL and pooled.pooled_throughput is not None
    assert pooled.pooled_throughput.sessions == 1
    assert H.timed_on(record([1.2, 1.3]).resources[0], history) == AMD   # new runs: here


def test_a_record_alone_in_the_history_pools_one_session() -> None:
    p = H.pool_records(record([1.15, 1.16]), H.TimingHistory()).resources[0].pooled_throughput
    assert p is not None and p.basis == "seeds" and p.sessions == 1


# --------------------------------------------------------------------------------------------
# Recording: once per session
# --------------------------------------------------------------------------------------------

def test_merging_replaces_a_session_and_never_repeats_it() -> None:
    one = H.TimingHistory(suites={"s": {"x": 1}}, entries=[entry([1.1, 1.2], commit="a")])
    assert H.merged(one, one) == one                                       # idempotent
    redone = H.TimingHistory(entries=[entry([1.0, 0.9], commit="a")])        # same profile/commit
    assert H.merged(one, redone).entries == redone.entries
    # the same runs republished from another commit and machine (reused, not timed again):
    # one entry, dated and placed as the session that timed them
    moved = H.TimingHistory(entries=[entry([1.1, 1.2], commit="z", date="2026-12-02",
                                           machine=INTEL)])
    assert H.merged(one, moved).entries == one.entries
    new = H.TimingHistory(entries=[entry([1.3, 1.4], commit="b", date="2026-12-03")])
    both = H.merged(one, new)
    assert [e.commit for e in both.entries] == ["a", "b"] and both.suites == one.suites
    assert H.merged(both, new) == both


def published_profile(root: Path, tps: dict[int, tuple[float, float]], commit: str,
                      cpu: str = "AMD EPYC") -> Path:
    """A published profile's files that the history reads: provenance, parameters, runs."""
    folder = root / "published" / "reference"
    config = {"model": MODEL, "settings": SETTINGS}
    for seed, (a, b) in tps.items():
        runs = folder / "results" / "rgc" / "runs" / "shakespeare" / f"seed{seed}"
        make_run(runs, "rgc-async", "rgc", details={"executor": "async"}, seed=seed, tps=a,
                 processes=2, threads=2, config=config)
        make_run(runs, "backprop", "backprop", details={"executor": "backprop"}, seed=seed,
                 tps=b, threads=2, config=config)
    (folder / "reports").mkdir(parents=True)
    (folder / "reports" / "provenance.json").write_text(json.dumps({
        "git": {"commit": commit, "dirty": False}, "generated_at": "2026-12-05T18:00:00+00:00",
        "machine": {"cpu_model": cpu, "usable_cores": 2, "cpu_count": 2}}))
    (folder / "results" / "params.json").write_text(json.dumps({"profile": "reference"}))
    return folder


def test_record_profile_is_idempotent_and_the_analysis_sees_the_same_suite(tmp_path: Path
                                                                           ) -> None:
    folder = published_profile(tmp_path, {0: (1150.0, 1000.0), 1: (1160.0, 1000.0)}, "abc")
    path = tmp_path / "published" / H.HISTORY_NAME
    new = H.record_profile(folder, path)
    (e,) = new.entries
    assert e.throughput_ratios == pytest.approx([1.15, 1.16]) and e.seeds == [0, 1]
    assert e.machine == AMD and e.commit == "abc" and e.profile == "reference"
    text = path.read_text()
    H.record_profile(folder, path)
    assert path.read_text() == text                                  # republished: unchanged
    assert H.read_history(path).suites[e.suite]["candidate"]["executor"] == "async"
    # the analysis of the same runs keys them alike, and the claims count them once
    rec = A.analysis_records(collect_runs(folder / "results" / "rgc" / "runs"), machine=AMD)
    (r,) = [x for x in rec.resources if x.candidate_role == ROLE_RGC_ASYNC]
    assert r.suite == e.suite and r.timing_seeds == [0, 1]
    assert r.throughput_ratios == e.throughput_ratios
    assert H.sessions_of(r, H.read_history(path)) == [e.throughput_ratios]


def test_a_history_file_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"format": "something/1", "entries": []}))
    with pytest.raises(ParameterError, match="lmrepro.timing_history/1"):
        H.read_history(path)
    assert H.read_history(tmp_path / "none.json") == H.TimingHistory()
    with pytest.raises(ParameterError, match="profile_dir = .*must be a published profile"):
        H.record_profile(tmp_path / "nothing", path)
    with pytest.raises(ValueError, match="must be as many"):
        H.HistoryEntry.model_validate({**entry([1.1]).model_dump(), "seeds": [0, 1]})


def test_the_committed_history_holds_every_published_profiles_session() -> None:
    """published/timing_history.json has each published profile's current entries (what
    ``lmrepro publish`` would record), and its toy suites and other machines key apart from
    the reference suite."""
    history = H.read_history(ROOT / H.HISTORY_FILE)
    for folder in sorted((ROOT / "published").iterdir()):
        if not (folder / "reports" / "provenance.json").is_file():
            continue
        # publishing it again would change nothing (its entries are there, each dated as the
        # session that timed its runs)
        assert H.merged(history, H.profile_entries(folder)) == history, folder.name
    by_profile = {e.profile: e for e in history.entries}
    reference = by_profile["reference"]
    for toy in ("horizon", "mechanism", "rgc_horizon_h2", "scaling"):
        assert by_profile[toy].suite != reference.suite
    assert by_profile["scaling"].machine != reference.machine
    assert set(history.suites) == {e.suite for e in history.entries}
    assert read_json(ROOT / H.HISTORY_FILE)["format"] == H.HISTORY_FORMAT
