"""Benchmark (not a test): async RGC vs global backprop at equal total cores, over thread layouts.

Uses the RGC engineer's API unchanged (:func:`lmrepro.rgc.train` with an
:class:`lmrepro.rgc.RGCConfig`). For each allocation the async executor runs one process per stage
with ``threads_per_stage`` intra-op threads, and global backprop runs in one process with
``backprop_threads`` threads; "equal total cores" means both get the machine's cores
(``os.cpu_count()``); a layout with more stage threads than cores is run and marked
*oversubscribed* (it is the only way to run 4 stages on 2 cores).

Reported per run: the project's own tokens/s (training only) and peak RSS of the process tree
(:class:`lmrepro.memory.MemorySampler`, which counts shared library pages once per process),
plus, sampled by this benchmark from outside, the peak PSS of the process tree (shared pages
split between the processes sharing them), which is fairer to multi-process executors.
Every run is a fresh child process (``--one``), so no run inherits another's memory or helper
processes (the async executor leaves a forkserver behind). Ratios async / backprop are measured
side by side, interleaved (async, backprop, async, ...) over ``--repeats``.

    /tmp/venv/bin/python bench/bench_rgc_sweep.py            # ~3 minutes on 2 cores

Writes ``bench/results/rgc_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "rgc_sweep.json"


class PeakPSSSampler:
    """Peak proportional set size (PSS) of this process and its descendants, sampled in a
    thread every ``interval_s`` (PSS needs ``/proc/PID/smaps_rollup``; where unreadable the
    process's RSS is used instead and ``approximate`` is set)."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.approximate = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                self.approximate = True
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            except psutil.Error:
                continue
        self.peak_bytes = max(self.peak_bytes, total)
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakPSSSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def load_corpus() -> tuple[np.ndarray, np.ndarray, str]:
    p = REPO / "data" / "embedded" / "shakespeare.txt"
    if p.is_file():
        data = np.fromfile(p, dtype=np.uint8)
        cut = int(0.95 * len(data))
        return data[:cut], data[cut:], "shakespeare"
    from lmrepro.rgc.common import synthetic_corpus

    data = synthetic_corpus(400_000)
    return data[:360_000], data[360_000:], "synthetic"


def run_one(cfg: Any, executor: str, train_data: np.ndarray, val_data: np.ndarray,
            corpus: str) -> dict[str, Any]:
    from lmrepro.rgc import train

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as w, PeakPSSSampler() as pss:
        warnings.simplefilter("always")
        r = train(cfg, executor, train_data, val_data, corpus=corpus)
    over = any("oversubscribed" in str(x.message) for x in w)
    return {"executor": executor, "tokens_per_s": r.tokens_per_s,
            "peak_rss_bytes": r.peak_rss_bytes, "peak_pss_bytes": pss.peak_bytes,
            "pss_approximate": pss.approximate, "final_bpb": r.final_bpb,
            "oversubscribed": over, "wall_s": time.perf_counter() - t0}


def run_isolated(cfg: Any, executor: str) -> dict[str, Any]:
    """:func:`run_one` in a fresh Python process; its result comes back as JSON."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one",
                           json.dumps(cfg.to_dict()), executor], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{executor} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        from lmrepro.rgc import RGCConfig

        tr, va, corpus = load_corpus()
        res = run_one(RGCConfig(**json.loads(argv[1])), argv[2], tr, va, corpus)
        print(json.dumps(res))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--layouts", default="1,1;1,1,1,1",
                    help="semicolon-separated threads-per-stage lists (K = list length)")
    ap.add_argument("--json-out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)

    from lmrepro.bench.machine import busy_processes, load_average, machine_info
    from lmrepro.rgc import RGCConfig

    cores = os.cpu_count() or 1
    info = machine_info()
    info["busy_processes_at_start"] = busy_processes()
    load_start = load_average()
    _, _, corpus = load_corpus()
    print(f"bench_rgc_sweep: {info['cpu_model']}, {cores} cores, torch {info['torch']}; corpus "
          f"{corpus}; L={args.n_layers} d={args.d_model} T={args.context} batch "
          f"{args.batch_size}x{args.micro_batches} micro-batches; {args.steps} steps; load "
          f"{load_start}", flush=True)
    t_begin = time.perf_counter()
    rows = []
    for layout in args.layouts.split(";"):
        alloc = tuple(int(t) for t in layout.split(","))
        cfg = RGCConfig(n_layers=args.n_layers, n_stages=len(alloc), horizon=1,
                        d_model=args.d_model, n_heads=4, context=args.context,
                        batch_size=args.batch_size, micro_batches=args.micro_batches,
                        steps=args.steps, warmup_steps=min(5, args.steps),
                        threads_per_stage=alloc, backprop_threads=cores,
                        eval_batches=4, eval_batch_size=8, checkpoint_every=0)
        runs: dict[str, list[dict]] = {"async": [], "backprop": []}
        for rep in range(args.repeats):
            for ex in ("async", "backprop"):
                r = run_isolated(cfg, ex)
                runs[ex].append(r)
                print(f"  layout {list(alloc)} vs backprop {cores} threads, {ex:8s} #{rep + 1}: "
                      f"{r['tokens_per_s']:8.0f} tokens/s, RSS {r['peak_rss_bytes'] / 2**20:7.0f}"
                      f" MiB, PSS {r['peak_pss_bytes'] / 2**20:7.0f} MiB"
                      f"{' (oversubscribed)' if r['oversubscribed'] else ''}", flush=True)
        med = {ex: {k: float(np.median([r[k] for r in rs]))
                    for k in ("tokens_per_s", "peak_rss_bytes", "peak_pss_bytes")}
               for ex, rs in runs.items()}
        row = {
            "threads_per_stage": list(alloc), "n_stages": len(alloc),
            "async_total_threads": sum(alloc), "backprop_threads": cores, "cores": cores,
            "async_oversubscribed": sum(alloc) > cores, "median": med, "runs": runs,
            "throughput_ratio": med["async"]["tokens_per_s"] / med["backprop"]["tokens_per_s"],
            "memory_ratio_rss": med["async"]["peak_rss_bytes"] /
            med["backprop"]["peak_rss_bytes"],
            "memory_ratio_pss": med["async"]["peak_pss_bytes"] /
            med["backprop"]["peak_pss_bytes"],
        }
        row["meets_paper_target"] = row["throughput_ratio"] >= 1.38 and \
            row["memory_ratio_rss"] <= 1.5
        rows.append(row)
        print(f"  => {list(alloc)}: throughput x{row['throughput_ratio']:.3f}, memory (RSS) "
              f"x{row['memory_ratio_rss']:.2f}, (PSS) x{row['memory_ratio_pss']:.2f}", flush=True)
    result = {"benchmark": "rgc_sweep", "machine": info, "args": vars(args), "corpus": corpus,
              "rows": rows, "targets": {"throughput_ratio_min": 1.38, "memory_ratio_max": 1.5,
                                        "paper_memory_ratio": 4.31 / 1.94},
              "loadavg_start": load_start, "loadavg_end": load_average(),
              "busy_processes_at_end": busy_processes(),
              "wall_s": time.perf_counter() - t_begin}
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
