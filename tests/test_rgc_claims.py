"""The RGC claims' declarations (lmrepro.rgc.claims): PSS for memory, the core budgets named."""

from __future__ import annotations

import pytest

from lmrepro.pipeline.analysis import (ROLE_BACKPROP, ROLE_RGC_ASYNC, AnalysisRecords,
                                       ResourceRecord, RunRecord)
from lmrepro.rgc import claims
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


def test_memory_claim_uses_pss_and_says_so() -> None:
    (m,) = claims.memory(records(rss_gib=(3.0, 1.0), pss_gib=(1.5, 1.0)))
    assert m.value == pytest.approx(1.5)          # the PSS ratio, not RSS's 3.0
    assert "1.500 vs 1.000 GiB peak PSS" in m.measured and m.reproduced


def test_memory_claim_without_pss_says_it_fell_back_to_rss() -> None:
    (m,) = claims.memory(records(rss_gib=(3.0, 1.0)))
    assert m.value == pytest.approx(3.0) and "RSS (the runs recorded no PSS)" in m.measured


@pytest.mark.parametrize("threads, text", [((2, 2), "same core budget: 2 threads each"),
                                           ((29, 24), "async 29 threads vs backprop 24")])
def test_throughput_claim_names_the_core_budgets(threads: tuple[int, int], text: str) -> None:
    (m,) = claims.throughput(records(tps=(1100.0, 1000.0), threads=threads))
    assert m.value == pytest.approx(1.1) and text in m.measured and m.reproduced is True
    # inside the step-time spread the verdict is inconclusive, whatever the ratio
    rec = records(tps=(1100.0, 1000.0), threads=threads)
    rec.resources[0] = rec.resources[0].model_copy(update={"throughput_conclusive": False})
    (m,) = claims.throughput(rec)
    assert m.reproduced is None
    declared = {c.id: c for c in claims.CLAIMS}
    assert "async 29 worker threads vs backprop 24" in declared["rgc-throughput"].paper_figure
    assert "PSS" in declared["rgc-memory"].rule
