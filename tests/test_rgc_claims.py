"""The RGC claims' declarations (lmrepro.rgc.claims): memory judged on RSS and PSS alike (the
paper names no metric), the core budgets named, and
the one labelling rule (lmrepro.pipeline.claims.label): reproduced within the claim's stated
tolerance of the paper's figure, direction only when only the sign agrees."""

from __future__ import annotations

import pytest

import math

from lmrepro.pipeline import claims as C
from lmrepro.pipeline.records import AnalysisRecords, ResourceRecord, RunRecord
from lmrepro.rgc import claims
from lmrepro.rgc.roles import ROLE_BACKPROP, ROLE_RGC_ASYNC
from lmrepro.stats import StatsConfig

GIB = 2**30


def run(name: str, role: str, threads: int, processes: int) -> RunRecord:
    return RunRecord(name=name, role=role, method="rgc" if role == ROLE_RGC_ASYNC else "backprop",
                     corpus="shakespeare", seed=0, sparsity=None, processes=processes,
                     threads=threads, steps=10, final_bpb=4.0, tokens_per_s=1000.0,
                     mean_step_time_s=1.0, step_time_std_s=0.01, peak_rss_bytes=GIB,
                     scale="tiny", configuration=name)


def records(*, tps: tuple[float, float] = (1000.0, 1000.0),
            threads: tuple[int, int] = (2, 2), rss_gib: tuple[float, float] = (1.0, 1.0),
            pss_gib: tuple[float, float] | None = None) -> AnalysisRecords:
    """One async-RGC-vs-backprop resource record (candidate first in every pair)."""
    c, b = run("rgc-async", ROLE_RGC_ASYNC, threads[0], 2), run("backprop", ROLE_BACKPROP,
                                                              threads[1], 1)
    pss = (None, None) if pss_gib is None else (pss_gib[0] * GIB, pss_gib[1] * GIB)
    res = ResourceRecord(
        label="rgc_async vs backprop", corpus="shakespeare", candidate_role=ROLE_RGC_ASYNC,
        baseline_role=ROLE_BACKPROP, candidate_configuration=c.configuration,
        baseline_configuration=b.configuration, candidate_runs=[c.name], baseline_runs=[b.name],
        sparsity=None, candidate_step_time_s=1.0, baseline_step_time_s=tps[0] / tps[1],
        candidate_step_time_spread_s=0.01, baseline_step_time_spread_s=0.01,
        candidate_steps=10, baseline_steps=10, candidate_tokens_per_s=tps[0],
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
