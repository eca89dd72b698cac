"""The RGC claims' declarations (lmrepro.rgc.claims): memory judged on RSS and PSS alike (the
paper names no metric), the core budgets named, and
the one labelling rule (lmrepro.pipeline.claims.label): reproduced within the claim's stated
tolerance of the paper's figure, direction only when only the sign agrees."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lmrepro.pipeline import claims as C
from lmrepro.pipeline.resources import ONE_SESSION_CAVEAT
from lmrepro.pipeline.records import AnalysisRecords, ResourceRecord, RunRecord
from lmrepro.rgc import claims
from lmrepro.rgc.roles import ROLE_BACKPROP, ROLE_RGC_ASYNC
from lmrepro.stats import StatsConfig

GIB = 2**30


def run(name: str, role: str, threads: int, processes: int) -> RunRecord:
    return RunRecord(name=name, role=role, method="rgc" if role == ROLE_RGC_ASYNC else "backprop",
                     corpus="shakespeare", seed=0, setting=None, processes=processes,
                     threads=threads, steps=10, final_bpb=4.0, tokens_per_s=1000.0,
                     mean_step_time_s=1.0, step_time_std_s=0.01, peak_rss_bytes=GIB,
                     scale="tiny", configuration=name)


def records(*, tps: tuple[float, float] = (1000.0, 1000.0),
            threads: tuple[int, int] = (2, 2), rss_gib: tuple[float, float] = (1.0, 1.0),
            pss_gib: tuple[float, float] | None = None, steps: int = 60) -> AnalysisRecords:
    """One async-RGC-vs-backprop resource record (candidate first in every pair), of runs of
    ``steps`` steps (by default long enough to be timed)."""
    c, b = run("rgc-async", ROLE_RGC_ASYNC, threads[0], 2), run("backprop", ROLE_BACKPROP,
                                                              threads[1], 1)
    pss = (None, None) if pss_gib is None else (pss_gib[0] * GIB, pss_gib[1] * GIB)
    res = ResourceRecord(
        label="rgc_async vs backprop", corpus="shakespeare", candidate_role=ROLE_RGC_ASYNC,
        baseline_role=ROLE_BACKPROP, candidate_configuration=c.configuration,
        baseline_configuration=b.configuration, candidate_runs=[c.name], baseline_runs=[b.name],
        setting=None, candidate_step_time_s=1.0, baseline_step_time_s=tps[0] / tps[1],
        candidate_step_time_spread_s=0.01, baseline_step_time_spread_s=0.01,
        candidate_steps=steps, baseline_steps=steps, candidate_tokens_per_s=tps[0],
        baseline_tokens_per_s=tps[1], candidate_threads=threads[0], baseline_threads=threads[1],
        candidate_processes=2, baseline_processes=1, candidate_peak_rss_bytes=rss_gib[0] * GIB,
        baseline_peak_rss_bytes=rss_gib[1] * GIB, candidate_peak_pss_bytes=pss[0],
        baseline_peak_pss_bytes=pss[1], speedup=tps[0] / tps[1], throughput_ratio=tps[0] / tps[1],
        wall_ratio=tps[1] / tps[0], memory_ratio=rss_gib[0] / rss_gib[1],
        pss_ratio=None if pss_gib is None else pss_gib[0] / pss_gib[1], relative_spread=0.02,
        speedup_conclusive=True, throughput_conclusive=True, wall_conclusive=True, caveats=[])
    return AnalysisRecords(stage="rgc", stats=StatsConfig(), seeds=[0], cores=2, runs=[c, b],
                           comparisons=[], resources=[res])


def test_memory_claim_gives_both_metrics_and_needs_both_inside_to_reproduce() -> None:
    """The paper names no metric: reproduced only where RSS and PSS both lie inside the
    tolerance (1.78x to 2.78x); both above 1 but one outside is direction only."""
    (m,) = claims.memory(records(rss_gib=(2.0, 1.0), pss_gib=(1.9, 1.0)))
    assert "2.000 vs 1.000 GiB peak RSS (2.00x)" in m.measured
    assert "1.900 vs 1.000 GiB peak PSS (1.90x)" in m.measured
    assert "evaluation copy and hand-over excluded" in m.measured
    assert m.value == pytest.approx(1.9) and m.verdict == C.REPRODUCED
    (m,) = claims.memory(records(rss_gib=(2.0, 1.0), pss_gib=(1.5, 1.0)))
    assert m.verdict == C.DIRECTION_ONLY          # RSS inside, PSS outside
    (m,) = claims.memory(records(rss_gib=(1.2, 1.0), pss_gib=(0.9, 1.0)))
    assert m.reproduced is None                   # the metrics disagree in direction
    declared = {c.id: c for c in claims.CLAIMS}["rgc-memory"]
    assert "on peak RSS and on peak PSS" in declared.rule
    assert "fresh process tree" in declared.rule and "hand-over" in declared.rule


def test_memory_claim_without_pss_says_so() -> None:
    (m,) = claims.memory(records(rss_gib=(3.0, 1.0)))
    assert m.value == pytest.approx(3.0) and "PSS not recorded" in m.measured
    assert m.verdict == C.DIRECTION_ONLY          # judged on the one metric recorded


@pytest.mark.parametrize("threads, text", [((2, 2), "same core budget: 2 threads each"),
                                           ((29, 24), "async 29 threads vs backprop 24")])
def test_throughput_claim_names_the_core_budgets(threads: tuple[int, int], text: str) -> None:
    (m,) = claims.throughput(records(tps=(1100.0, 1000.0), threads=threads))
    assert m.value == pytest.approx(1.1) and text in m.measured
    assert m.verdict == C.DIRECTION_ONLY          # faster, but not within 10 % of 1.382x
    # inside the step-time spread the verdict is inconclusive, whatever the ratio
    rec = records(tps=(1100.0, 1000.0), threads=threads)
    rec.resources[0] = rec.resources[0].model_copy(update={"throughput_conclusive": False})
    (m,) = claims.throughput(rec)
    assert m.reproduced is None
    declared = {c.id: c for c in claims.CLAIMS}
    assert "async 29 worker threads vs backprop 24" in declared["rgc-throughput"].paper_figure
    assert "PSS" in declared["rgc-memory"].rule


@pytest.mark.parametrize("ratio, verdict", [
    (1.382, C.REPRODUCED), (1.25, C.REPRODUCED), (1.52, C.REPRODUCED),
    (1.15, C.DIRECTION_ONLY), (1.6, C.DIRECTION_ONLY), (0.95, C.NOT_REPRODUCED)])
def test_throughput_is_reproduced_only_within_its_tolerance(ratio: float, verdict: str) -> None:
    """The published 1.15x (async over backprop, 3 seeds) is direction only against 1.382x."""
    (m,) = claims.throughput(records(tps=(1000.0 * ratio, 1000.0)))
    assert m.verdict == verdict


@pytest.mark.parametrize("rss, verdict", [
    ((2.22, 1.0), C.REPRODUCED), ((1.8, 1.0), C.REPRODUCED), ((2.75, 1.0), C.REPRODUCED),
    ((1.46, 1.0), C.DIRECTION_ONLY), ((3.0, 1.0), C.DIRECTION_ONLY),
    ((0.9, 1.0), C.NOT_REPRODUCED)])
def test_memory_is_reproduced_only_within_its_tolerance(rss: tuple[float, float], verdict: str
                                                        ) -> None:
    (m,) = claims.memory(records(rss_gib=rss, pss_gib=rss))
    assert m.verdict == verdict


def test_the_rule_is_one_function_of_the_figure_the_tolerance_and_the_spread() -> None:
    t = C.Tolerance(2.0, 0.1)
    assert t.bounds() == pytest.approx((1.8, 2.2))
    assert C.label(2.1, t) == (True, False) and C.label(1.5, t) == (True, True)
    assert C.label(0.5, t) == (False, False) and C.label(math.nan, t) == (False, False)
    assert C.label(2.1, t, decided=False) == (None, False)
    log = C.Tolerance(2.0, 0.25, log=True)
    assert log.bounds() == pytest.approx((1.6, 2.5))
    # a difference whose direction is its sign (reference 0), with an explicit band
    gap = C.Tolerance.band(0.008, 0.0, 0.02, reference=0.0, unit="%")
    assert C.label(0.019, gap) == (True, False) and C.label(0.05, gap) == (True, True)
    assert C.label(-0.001, gap) == (False, False)
    assert gap.text() == "around 0.8 %: 0 % to 2 %"
    with pytest.raises(ValueError, match="low <= paper <= high"):
        C.Tolerance.band(0.03, 0.0, 0.02, reference=0.0, unit="%")


def test_every_rgc_claim_with_a_figure_shows_its_tolerance_beside_it() -> None:
    table = C.claims_table(records(tps=(1150.0, 1000.0), rss_gib=(1.46, 1.0),
                                   pss_gib=(1.3, 1.0)),
                           claims.CLAIMS).set_index("id")
    for cid in ("rgc-throughput", "rgc-throughput-paper-ratio", "rgc-memory",
                "rgc-quality-length"):
        assert "(reproduced iff " in table.loc[cid, "paper_figure"], cid
    assert "within 10 % of 1.382x: 1.244x to 1.52x" in table.loc["rgc-throughput", "paper_figure"]
    assert table.loc["rgc-throughput", "verdict"] == C.DIRECTION_ONLY
    assert table.loc["rgc-memory", "verdict"] == C.DIRECTION_ONLY


def pooled_records(this_run: list[float], sessions: list[list[float]]) -> AnalysisRecords:
    """One async-vs-backprop record of ``this_run``'s per-seed ratios with the history's
    ``sessions`` of its suite on its machine pooled in (as the claims stage does)."""
    from lmrepro.pipeline import timing_history as H
    from lmrepro.pipeline.records import Machine

    machine = Machine(cpu_model="AMD EPYC", cores=2)
    rec = records(tps=(1000.0 * sum(this_run) / len(this_run), 1000.0))
    r = rec.resources[0].model_copy(update={
        "suite": "s", "machine": machine, "timing_seeds": list(range(len(this_run))),
        "throughput_ratios": this_run, "throughput_conclusive": True,
        "caveats": [ONE_SESSION_CAVEAT]})
    history = H.TimingHistory(entries=[H.HistoryEntry(
        profile="reference", commit=f"c{i}", dirty=False, date=f"2026-12-0{i + 1}",
        machine=machine, stage="rgc", label=r.label, corpus="shakespeare",
        candidate_role=ROLE_RGC_ASYNC, baseline_role=ROLE_BACKPROP, suite="s",
        seeds=list(range(len(s))), candidate_tokens_per_s=[1000.0 * x for x in s],
        baseline_tokens_per_s=[1000.0] * len(s), throughput_ratios=s)
        for i, s in enumerate(sessions)])
    return H.pool_records(rec.model_copy(update={"resources": [r]}), history)


def test_throughput_is_judged_on_the_sessions_pooled() -> None:
    """published/reference's three sessions: this run's 1.15x [1.13, 1.17] is conclusive on its
    own seeds, but pooled over the sessions 1.08x [0.94, 1.24] is inconclusive."""
    (m,) = claims.throughput(pooled_records([1.143, 1.152, 1.159],
                                            [[1.075, 1.091, 1.020], [0.961, 1.127, 1.015]]))
    assert m.measured.startswith("this run 1.15x tokens/s")
    assert ("pooled over 3 sessions (9 seeds) on AMD EPYC, 2 cores: 1.08x [0.938, 1.24] "
            "(session-level 95 % t interval)") in m.measured
    assert m.value == pytest.approx(1.08, abs=0.005) and m.verdict == C.INCONCLUSIVE
    assert ONE_SESSION_CAVEAT not in m.caveats      # the sessions' spread decided
    # sessions that agree decide, on the pooled ratio: this run alone (1.205x) is outside
    # 1.244x to 1.52x, the four sessions' 1.29x inside it
    sessions = [[1.33, 1.34], [1.30, 1.31], [1.32, 1.33]]
    (alone,) = claims.throughput(pooled_records([1.20, 1.21], []))
    assert alone.verdict == C.DIRECTION_ONLY
    (m,) = claims.throughput(pooled_records([1.20, 1.21], sessions))
    means = [sum(map(math.log, s)) / 2 for s in [[1.20, 1.21], *sessions]]
    assert m.verdict == C.REPRODUCED and m.value == pytest.approx(math.exp(sum(means) / 4))


def test_throughput_with_one_session_keeps_its_own_interval_and_says_so() -> None:
    (m,) = claims.throughput(pooled_records([1.143, 1.152, 1.159], []))
    assert "one session of this suite recorded on AMD EPYC, 2 cores" in m.measured
    assert m.value == pytest.approx((1.143 + 1.152 + 1.159) / 3)    # this run's ratio
    assert m.verdict == C.DIRECTION_ONLY and ONE_SESSION_CAVEAT in m.caveats
    # a record written before the history: judged as before, nothing said of sessions
    (old,) = claims.throughput(records(tps=(1150.0, 1000.0)))
    assert "session" not in old.measured and old.verdict == C.DIRECTION_ONLY


def test_the_claims_stage_pools_the_history_it_is_given(tmp_path: Path) -> None:
    from lmrepro.io import atomic_write_json
    from lmrepro.pipeline import timing_history as H

    pooled = pooled_records([1.143, 1.152, 1.159], [[1.075, 1.091, 1.020],
                                                     [0.961, 1.127, 1.015]])
    rec = pooled.model_copy(update={"resources": [
        r.model_copy(update={"pooled_throughput": None}) for r in pooled.resources]})
    atomic_write_json(tmp_path / "rgc" / "analysis.json", rec.model_dump(mode="json"))
    history = tmp_path / "history.json"
    first = pooled_records([1.0], [[1.075, 1.091, 1.020], [0.961, 1.127, 1.015]])
    atomic_write_json(history, H.TimingHistory(entries=[
        H.HistoryEntry(profile="reference", commit=f"c{i}", dirty=False, date=None,
                       machine=first.resources[0].machine, stage="rgc", label="x",
                       corpus="shakespeare", candidate_role=ROLE_RGC_ASYNC,
                       baseline_role=ROLE_BACKPROP, suite="s", seeds=[0, 1, 2],
                       candidate_tokens_per_s=s, baseline_tokens_per_s=[1.0] * 3,
                       throughput_ratios=s)
        for i, s in enumerate([[1.075, 1.091, 1.020], [0.961, 1.127, 1.015]])]
    ).model_dump(mode="json"))
    row = C.claims_stage(tmp_path, tmp_path, timing_history=history).set_index("id").loc[
        "rgc-throughput"]
    assert "pooled over 3 sessions" in row.measured and row.verdict == C.INCONCLUSIVE
    alone = C.claims_stage(tmp_path, tmp_path, timing_history=None).set_index("id").loc[
        "rgc-throughput"]
    assert "session" not in alone.measured and alone.verdict == C.DIRECTION_ONLY
