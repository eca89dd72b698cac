"""The RGC claims' declarations (lmrepro.rgc.claims): PSS for memory, the core budgets named."""

from __future__ import annotations

import pytest

from lmrepro.pipeline.analysis import ROLE_BACKPROP, ROLE_RGC_ASYNC, AnalysisRecords, RunRecord
from lmrepro.rgc import claims
from lmrepro.stats import StatsConfig

GIB = 2**30


class RunRecordWithPSS(RunRecord):
    """A run record that carries the summary's peak PSS (RunSummary.peak_pss_bytes)."""

    peak_pss_bytes: int | None = None


def record(cls: type[RunRecord], name: str, role: str, tps: float, rss_gib: float,
           threads: int, processes: int = 1, **kw: object) -> RunRecord:
    return cls(name=name, role=role, method="rgc" if role == ROLE_RGC_ASYNC else "backprop",
               corpus="shakespeare", seed=0, sparsity=None, processes=processes,
               threads=threads, steps=10, final_bpb=4.0, tokens_per_s=tps,
               mean_step_time_s=1.0, peak_rss_bytes=int(rss_gib * GIB), scale="tiny", **kw)


def records(*runs: RunRecord) -> AnalysisRecords:
    return AnalysisRecords(stage="rgc", stats=StatsConfig(), runs=list(runs), comparisons=[])


def test_memory_claim_uses_pss_and_says_so() -> None:
    recs = records(
        record(RunRecordWithPSS, "rgc-async", ROLE_RGC_ASYNC, 900.0, 3.0, 2, processes=2,
               peak_pss_bytes=int(1.5 * GIB)),
        record(RunRecordWithPSS, "backprop", ROLE_BACKPROP, 1000.0, 1.0, 2,
               peak_pss_bytes=int(1.0 * GIB)))
    (m,) = claims.memory(recs)
    assert m.value == pytest.approx(1.5)          # the PSS ratio, not RSS's 3.0
    assert "1.500 vs 1.000 GiB peak PSS" in m.measured and m.reproduced


def test_memory_claim_without_pss_says_it_fell_back_to_rss() -> None:
    recs = records(record(RunRecord, "rgc-async", ROLE_RGC_ASYNC, 900.0, 3.0, 2, processes=2),
                   record(RunRecord, "backprop", ROLE_BACKPROP, 1000.0, 1.0, 2))
    (m,) = claims.memory(recs)
    assert m.value == pytest.approx(3.0) and "RSS (the analysis records carry no PSS)" in \
        m.measured


@pytest.mark.parametrize("threads, text", [(2, "same core budget: 2 threads each"),
                                           (24, "async 29 threads vs backprop 24")])
def test_throughput_claim_names_the_core_budgets(threads: int, text: str) -> None:
    async_threads = 2 if threads == 2 else 29
    recs = records(record(RunRecord, "rgc-async", ROLE_RGC_ASYNC, 1100.0, 1.0, async_threads,
                          processes=2),
                   record(RunRecord, "backprop", ROLE_BACKPROP, 1000.0, 1.0, threads))
    (m,) = claims.throughput(recs)
    assert m.value == pytest.approx(1.1) and text in m.measured
    declared = {c.id: c for c in claims.CLAIMS}
    assert "async 29 worker threads vs backprop 24" in declared["rgc-throughput"].paper_figure
    assert "PSS" in declared["rgc-memory"].rule
