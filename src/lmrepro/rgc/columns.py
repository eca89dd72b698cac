"""The RGC wing's table vocabulary: the columns of its training-length study's tables
(:data:`lmrepro.rgc.study.report.DISPLAY`, notebook 13), declared to the pipeline by
:mod:`lmrepro.rgc.wing` (``Wing.tables``); the study columns every wing shares are
:data:`lmrepro.pipeline.tables.COLUMNS`'."""

from __future__ import annotations

from lmrepro.pipeline.tables import Column, integer, sig3, text

COLUMNS: dict[str, Column] = {
    "backprop_test_bpb": Column("backprop (bits/byte, test)", sig3),
    "rgc_test_bpb": Column("RGC run (bits/byte, test)", sig3),
    # the frontier at the verdict point (study.report.frontier_table)
    "horizon": Column("H", integer),
    "consensus_staleness": Column("s", integer),
    "tokens_per_s_vs_backprop": Column("tokens/s x backprop (benchmark)", sig3),
    "benchmark_run": Column("benchmark run", text, False),
}

PRESETS: dict[str, list[str]] = {}
