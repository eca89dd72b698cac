"""Async RGC's throughput over backprop's, decomposed
(:func:`lmrepro.rgc.analysis.schedule.decompose`) from the RGC benchmark's stored results:
``bench/results/rgc.json`` (the benchmark's shape, at equal cores and at the paper's 29:24 core
ratio under a CPU quota) and ``bench/results/rgc_paper_shape.json`` (the paper's model shape on this
machine), and what the factors predict for the paper's allocation beside its 1.382x. Read by
docs/rgc.md's generator (bench/make_performance_doc.py) and the ``rgc-throughput-paper-ratio``
claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmrepro.bench import BENCH_RESULTS
from lmrepro.io import read_json
from lmrepro.rgc.analysis.schedule import SpeedupFactors, WorkerTimes, decompose, ideal_step_time

PAPER_SPEEDUP = 1.382
PAPER_THREADS = (29, 24)       # async worker threads, backprop threads (the paper's summary)
#: how far the schedule model may miss the measured async step and still be called validated
MODEL_TOLERANCE = 0.10


def load(name: str, results: str | Path = BENCH_RESULTS) -> dict[str, Any] | None:
    """A stored benchmark result (``<name>.json`` in ``results``), or None where it was never
    run."""
    path = Path(results) / f"{name}.json"
    return read_json(path) if path.exists() else None


def step_s(r: dict[str, Any], run: str) -> float:
    """Seconds per step of a benchmark run, from its median tokens/s (the figure the
    benchmark's ratios use)."""
    tokens_per_step = r["config"]["batch_size"] * r["config"]["model"]["context"]
    return tokens_per_step / r["median"][run]["tokens_per_s"]


def benchmark_factors(r: dict[str, Any]) -> list[tuple[str, SpeedupFactors, float]]:
    """The factors at the benchmark's shape, at equal cores and at the paper's core ratio."""
    ideal = r["ideal"]["async"]
    threads = r["threads"]
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


def prediction(r: dict[str, Any], p: dict[str, Any] | None) -> dict[str, Any] | None:
    """The paper's allocation predicted: its core ratio x the work efficiency and utilisation
    at the paper's shape here x our executor efficiency (None without both results)."""
    rows = benchmark_factors(r)
    shape = paper_shape_factors(p) if p is not None else None
    if shape is None:
        return None
    ratio = PAPER_THREADS[0] / PAPER_THREADS[1]
    exec_eff = rows[-1][1].executor_efficiency
    return {**shape, "core_ratio": ratio, "executor_efficiency": exec_eff,
            "predicted": ratio * shape["work_efficiency"] * shape["utilisation"] * exec_eff,
            "needed_non_core": PAPER_SPEEDUP / ratio}
