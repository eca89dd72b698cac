"""RGC report tables (lmrepro.rgc.analysis.report): the memory split and the lockstep check."""

from __future__ import annotations

import math

import pytest

from lmrepro.errors import ParameterError
from lmrepro.rgc.analysis.report import lockstep_check, memory_split, memory_split_table, runs_table

MIB = 2**20


def summary(name: str, executor: str, rss: int, pss: int, processes: int, **kw: object
            ) -> dict:
    return {"name": name,
            "method": "backprop" if executor == "backprop" else "rgc", "corpus": "c",
            "seed": 0, "final_bpb": 4.0, "tokens_per_s": 100.0, "peak_rss_bytes": rss * MIB,
            "peak_pss_bytes": pss * MIB, "peak_uss_bytes": pss * MIB, "processes": processes,
            "idle_torch_process": {"rss": 300 * MIB, "pss": 250 * MIB, "uss": 100 * MIB},
            "details": {"executor": executor,
                        "memory_processes": 1 + processes if executor == "async" else 1}, **kw}


def test_memory_split_charges_each_extra_process_one_idle_runtime() -> None:
    a = summary("rgc-async", "async", rss=900, pss=600, processes=2)
    b = summary("backprop", "backprop", rss=400, pss=350, processes=1)
    split = memory_split(a, b)
    assert split["extra_processes"] == 2 and split["pss_ratio"] == pytest.approx(600 / 350)
    # without the executor's measurement: 2 extra processes x the idle torch process's USS
    assert split["runtimes_bytes"] == split["idle_runtimes_bytes"] == 2 * 100 * MIB
    assert split["data_bytes"] == (600 - 350 - 200) * MIB and not split["runtimes_measured"]
    a_measured = {**a, "details": {**a["details"], "worker_runtimes_memory":
                                   {"rss": 500 * MIB, "pss": 150 * MIB, "uss": 10 * MIB}}}
    split = memory_split(a_measured, b)
    assert split["runtimes_measured"] and split["runtimes_bytes"] == 150 * MIB
    assert split["data_bytes"] == (600 - 350 - 150) * MIB
    split = memory_split(a, b)
    assert split["rss_ratio"] == pytest.approx(900 / 400)
    assert math.isclose(split["runtimes_share"], 200 / 250)
    table = memory_split_table({"a": a, "b": b})
    assert list(table["run"]) == ["a"] and table["extra processes"].iloc[0] == 2
    with pytest.raises(ParameterError, match="peak_pss_bytes"):
        memory_split({**a, "peak_pss_bytes": None}, b)


def test_lockstep_check_reports_the_largest_stage_loss_difference() -> None:
    steps = [{"step": i, "loss": 2.0 - 0.1 * i, "stage_losses": [3.0, 2.0 - 0.1 * i]}
             for i in range(3)]
    off = [dict(r, stage_losses=[r["stage_losses"][0] + 1e-6 * r["step"],
                                 r["stage_losses"][1]]) for r in steps]
    runs = {"rgc-async": {"summary": summary("rgc-async", "async", 900, 600, 2),
                          "metrics": off + [{"step": 2, "eval_bpb": 3.0}]},
            "rgc-sync": {"summary": summary("rgc-sync", "sync", 400, 350, 1),
                         "metrics": steps}}
    df, text = lockstep_check(runs)
    assert len(df) == 1 and df["steps compared"].iloc[0] == 3
    assert df["max |stage loss difference| (nats)"].iloc[0] == pytest.approx(2e-6)
    assert "at most 2.00e-06 nats" in text and "lockstep" in text
    assert lockstep_check({"rgc-async": runs["rgc-async"]})[0].empty
    assert list(runs_table({"x": runs["rgc-sync"]["summary"]})["peak PSS (GiB)"]) == \
        [pytest.approx(350 / 1024)]
