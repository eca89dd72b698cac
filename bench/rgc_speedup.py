"""docs/rgc.md, "The throughput ratio decomposed": async RGC's tokens/s over backprop's as core
ratio x work efficiency x utilisation x executor efficiency (:func:`lmrepro.rgc.schedule.decompose`)
from the RGC benchmark's results (``rgc.json``, the paper-shape ``rgc_paper_shape.json``), the
schedule model checked against the measured async step, and what the factors predict for the
paper's 29-against-24-thread allocation beside its 1.382x. Called by make_performance_doc.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmrepro.rgc.schedule import SpeedupFactors, WorkerTimes, decompose, ideal_step_time

PAPER_SPEEDUP = 1.382
PAPER_THREADS = (29, 24)       # async worker threads, backprop threads (the paper's summary)
#: how far the schedule model may miss the measured async step and still be called validated
MODEL_TOLERANCE = 0.10


def _row(label: str, f: SpeedupFactors, measured: float) -> list[str]:
    return [label, f"{f.core_ratio:.3f}", f"{f.work_efficiency:.3f}", f"{f.utilisation:.3f}",
            f"{f.executor_efficiency:.3f}", f"{f.speedup:.3f}", f"{measured:.3f}"]


def step_s(r: dict[str, Any], run: str) -> float:
    """Seconds per step of a benchmark run, from its median tokens/s (the figure the
    benchmark's ratios use)."""
    tokens_per_step = r["config"]["batch_size"] * r["config"]["context"]
    return tokens_per_step / r["median"][run]["tokens_per_s"]


def benchmark_factors(r: dict[str, Any]) -> list[tuple[str, SpeedupFactors, float]]:
    """The factors at the benchmark's shape, at equal cores and at the paper's core ratio."""
    ideal = r["ideal"]["async"]
    threads = r["threads_per_worker"]
    busy = sum(b * t for b, t in zip(ideal["busy_per_worker_s"], threads))
    async_step = step_s(r, "async")
    cores = float(sum(threads))
    out = []
    bp = step_s(r, "backprop")
    out.append(("equal cores", decompose(bp, cores, async_step, ideal["step_s"], busy, cores),
                bp / async_step))
    q = r["median"].get("backprop-paper-ratio")
    if q is not None and not q.get("interpolated"):
        qc = r["paper_allocation"]["backprop_cores_here"]
        q_step = step_s(r, "backprop-paper-ratio")
        out.append(("the paper's 29:24 (backprop under a CPU quota)",
                    decompose(q_step, qc, async_step, ideal["step_s"], busy, cores),
                    q_step / async_step))
    return out


def _stage(s: dict[str, Any]) -> dict[str, float]:
    return {k: v["median"] for k, v in s["seconds"].items()}


def paper_shape_factors(p: dict[str, Any]) -> dict[str, Any] | None:
    """At the paper's shape, measured on this machine at 1 thread per stage: the work
    efficiency of 1-thread stages against backprop on ``backprop_threads``, and the utilisation
    the schedule gives the paper's placement (one stage per worker) at its micro-batching."""
    stages = sorted((s for s in p.get("stage_compute", []) if s["threads"] == 1),
                    key=lambda s: s["stage"])
    bp = p.get("runs", {}).get("backprop", {}).get("step_time")
    if not stages or bp is None:
        return None
    M = p["config"]["micro_batches"]
    times = [_stage(s) for s in stages]
    workers = [WorkerTimes(t["forward"], t["readout"] + t["backward"], 0.0, t["optimizer"])
               for t in times]
    busy = sum(M * (w.pre_send + w.post_send) + w.optimizer for w in workers)
    ideal = ideal_step_time(workers, M, backward_phase=False, allreduce_s=0.0)
    bp_cores = p["backprop_threads"]
    return {"micro_batches": M, "backprop_step_s": bp["median"], "backprop_threads": bp_cores,
            "busy_core_s": busy, "ideal_step_s": ideal,
            "work_efficiency": bp["median"] * bp_cores / busy,
            "utilisation": busy / (len(workers) * ideal)}


def section(r: dict[str, Any] | None, p: dict[str, Any] | None,
            table: Callable[[list[str], list[list[Any]]], str]) -> str:
    """The markdown section (a note when the benchmark has not run); ``table`` renders a
    markdown table in the page's style."""
    head = "### The throughput ratio decomposed\n\n"
    if r is None:
        return head + "Not run yet: `python bench/bench_rgc.py`.\n"

    rows = benchmark_factors(r)
    ideal, measured = r["ideal"]["async"]["step_s"], step_s(r, "async")
    miss = 1 - ideal / measured
    parts = [head,
             "Async RGC's tokens/s over backprop's is the product of four factors "
             "(`lmrepro.rgc.schedule.decompose`): the **core ratio** (async cores over "
             "backprop's), the **work efficiency** (backprop's core-seconds per step over the "
             "async stages' compute, each measured alone at its worker's thread count: how much "
             "less CPU time small per-stage thread groups spend, readouts included), the "
             "**utilisation** (the stages' compute over the async cores' time in the ideal "
             "schedule: 1 minus the pipeline bubble and the workers' imbalance) and the "
             "**executor efficiency** (the ideal step over the measured one: transfers, Python, "
             "memory contention). At the benchmark's shape (`rgc.json`):\n\n",
             table(["backprop's cores", "core ratio", "work efficiency", "utilisation",
                     "executor efficiency", "product", "measured ratio"],
                    [_row(*x) for x in rows]),
             f"\n\nThe schedule model (`lmrepro.rgc.schedule`) predicts the async step at "
             f"{ideal * 1e3:.1f} ms against {measured * 1e3:.1f} ms measured (from the median "
             f"tokens/s): {abs(miss):.1%} {'shorter' if miss > 0 else 'longer'}, "
             f"{'within' if abs(miss) <= MODEL_TOLERANCE else 'outside'} the "
             f"{MODEL_TOLERANCE:.0%} the model is held to (it leaves out transfers and Python: "
             "it is a bound the executor approaches).\n"]
    shape = paper_shape_factors(p) if p is not None else None
    ratio = PAPER_THREADS[0] / PAPER_THREADS[1]
    need = PAPER_SPEEDUP / ratio
    if shape is not None:
        exec_eff = rows[-1][1].executor_efficiency
        pred = ratio * shape["work_efficiency"] * shape["utilisation"] * exec_eff
        parts.append(
            f"\nAt the paper's shape (`rgc_paper_shape.json`: 24 x 512, context 512, "
            f"{shape['micro_batches']} micro-batches): 1-thread stages against backprop on "
            f"{shape['backprop_threads']} threads ({shape['backprop_step_s']:.1f} s per step) "
            f"give a work efficiency of {shape['work_efficiency']:.3f}; the schedule gives the "
            f"paper's placement (4 workers, one stage each) a utilisation of "
            f"{shape['utilisation']:.3f} (the fill of the first micro-batch across the "
            f"workers). **A prediction for the paper's machine**, with those two factors and "
            f"our executor efficiency ({exec_eff:.3f}) standing in for what was not measured "
            f"there (thread groups of about 7 against 24 threads; its transfers): "
            f"{ratio:.3f} x {shape['work_efficiency']:.3f} x {shape['utilisation']:.3f} x "
            f"{exec_eff:.3f} = **{pred:.2f}x**, against the paper's {PAPER_SPEEDUP}x. The "
            f"paper's figure needs the three non-core factors to multiply to {need:.3f}; "
            f"ours multiply to {pred / ratio:.3f}. The gap is what larger thread groups lose "
            "to backprop on 24 threads (intra-op scaling is sub-linear: the paper attributes "
            "its gain to smaller, more efficient per-stage groups), which 2 cores cannot "
            "measure; the 16-core device script (`scripts/rgc-paper-shape.sh`) measures it "
            "where a machine is lent.\n")
    else:
        parts.append(f"\nThe paper's 1.382x needs the three non-core factors to multiply to "
                     f"{need:.3f} at its 29:24 core ratio.\n")
    return "".join(parts)
