"""Benchmark: async RGC vs global backprop (and optionally sync RGC), side by side in one run.

Measured by the project itself (:func:`lmrepro.rgc.train`): training tokens/s (start-up and final
evaluation excluded) and the sampled peak RSS of the whole process tree. Prints a table with the
ratios async/backprop and writes it as JSON. Optionally sweeps thread allocations:

    python bench/bench_rgc.py --steps 30 --threads 1,1,1,1 --threads 2,1,1,1
    python bench/bench_rgc.py --n-layers 24 --d-model 256 --threads 8,8,7,6   # paper-like, 29 vs 29

Each allocation runs async with ``threads_per_stage`` = the list and backprop with
``backprop_threads`` = its sum (the same total core budget). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np


def load_corpus(path: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    from lmrepro.rgc.common import synthetic_corpus

    candidates = [Path(path)] if path else [
        Path(__file__).resolve().parents[1] / "data" / "embedded" / "shakespeare.txt"]
    for p in candidates:
        if p.is_file():
            data = np.fromfile(p, dtype=np.uint8)
            cut = int(0.95 * len(data))
            return data[:cut], data[cut:], p.stem
    data = synthetic_corpus(400_000)
    return data[:360_000], data[360_000:], "synthetic"


def _stage_like_work(n: int, out: dict | None = None, idx: int = 0) -> float:
    """A stage-sized unit of work: forward+backward of a 2-block d=128 model, 1 intra-op thread."""
    import torch

    from lmrepro.model import ByteTransformer, ModelConfig, lm_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = ByteTransformer(ModelConfig(n_layers=2, d_model=128, n_heads=4, context=128))
    x = torch.randint(0, 256, (8, 128))
    t = time.perf_counter()
    for _ in range(n):
        lm_loss(m(x), x).backward()
    dt = time.perf_counter() - t
    if out is not None:
        out[idx] = dt
    return dt


def threads_vs_processes(n: int = 15) -> dict:
    """The measurement behind the async executor's design (docs/rgc.md): is
    ``torch.set_num_threads`` per Python thread, and do two stage workers run in parallel as
    Python threads or as spawned processes?"""
    import threading

    import torch
    import torch.multiprocessing as mp

    torch.set_num_threads(2)
    seen: dict = {}

    def probe() -> None:
        torch.set_num_threads(1)
        seen["in_thread"] = torch.get_num_threads()

    th = threading.Thread(target=probe)
    th.start()
    th.join()
    res = {"main_threads_after_a_thread_set_1": torch.get_num_threads()}
    _stage_like_work(3)
    res["one_worker_s"] = _stage_like_work(n)
    out: dict = {}
    ths = [threading.Thread(target=_stage_like_work, args=(n, out, i)) for i in range(2)]
    t = time.perf_counter()
    for x in ths:
        x.start()
    for x in ths:
        x.join()
    res["two_python_threads_wall_s"] = time.perf_counter() - t
    ctx = mp.get_context("spawn")
    shared = ctx.Manager().dict()
    ps = [ctx.Process(target=_stage_like_work, args=(n, shared, i)) for i in range(2)]
    t = time.perf_counter()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    res["two_processes_wall_incl_startup_s"] = time.perf_counter() - t
    res["two_processes_compute_s"] = dict(shared)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus-file", default=None, help="raw bytes (default: embedded corpus)")
    ap.add_argument("--n-layers", type=int, default=8)
    ap.add_argument("--n-stages", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", action="append", default=None,
                    help="comma-separated threads per stage; repeat to sweep (default 1 each)")
    ap.add_argument("--with-sync", action="store_true", help="also run the sync executor")
    ap.add_argument("--json-out", default=None, help="also write the table as JSON here")
    ap.add_argument("--threads-vs-processes", action="store_true",
                    help="only run the threads-vs-processes measurement")
    args = ap.parse_args(argv)
    if args.threads_vs_processes:
        print(json.dumps(threads_vs_processes(), indent=2))
        return 0

    import torch

    from lmrepro.rgc import RGCConfig, train

    train_data, val_data, corpus = load_corpus(args.corpus_file)
    allocations = [tuple(int(t) for t in a.split(",")) for a in
                   (args.threads or [",".join(["1"] * args.n_stages)])]
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}; corpus {corpus}; "
          f"model L={args.n_layers} K={args.n_stages} d={args.d_model} T={args.context}; "
          f"batch {args.batch_size} x {args.micro_batches} micro-batches; {args.steps} steps",
          flush=True)
    rows = []
    for alloc in allocations:
        cfg = RGCConfig(n_layers=args.n_layers, n_stages=args.n_stages, horizon=1,
                        d_model=args.d_model, n_heads=args.n_heads, context=args.context,
                        batch_size=args.batch_size, micro_batches=args.micro_batches,
                        steps=args.steps, warmup_steps=min(5, args.steps),
                        threads_per_stage=alloc, backprop_threads=sum(alloc),
                        eval_batches=4, eval_batch_size=8, checkpoint_every=0)
        executors = ["async", "backprop"] + (["sync"] if args.with_sync else [])
        res = {}
        for ex in executors:
            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                r = train(cfg, ex, train_data, val_data, corpus=corpus)
            res[ex] = r
            over = " (oversubscribed)" if any("oversubscribed" in str(x.message) for x in w) \
                else ""
            print(f"  threads {list(alloc)} {ex:8s}: {r.tokens_per_s:9.0f} tokens/s, "
                  f"peak RSS {r.peak_rss_bytes / 2**30:6.3f} GiB, bpb {r.final_bpb:.4f}, "
                  f"wall {time.perf_counter() - t0:5.1f} s{over}", flush=True)
        a, b = res["async"], res["backprop"]
        row = {
            "threads_per_stage": list(alloc), "backprop_threads": sum(alloc),
            **{f"{ex}_tokens_per_s": r.tokens_per_s for ex, r in res.items()},
            **{f"{ex}_peak_rss_bytes": r.peak_rss_bytes for ex, r in res.items()},
            **{f"{ex}_final_bpb": r.final_bpb for ex, r in res.items()},
            "throughput_ratio_async_over_backprop": a.tokens_per_s / b.tokens_per_s,
            "memory_ratio_async_over_backprop": a.peak_rss_bytes / b.peak_rss_bytes,
        }
        rows.append(row)
        print(f"  => async/backprop throughput {row['throughput_ratio_async_over_backprop']:.3f}x"
              f", peak memory {row['memory_ratio_async_over_backprop']:.3f}x", flush=True)
    out = {"cores": os.cpu_count(), "corpus": corpus, "args": vars(args), "rows": rows}
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_out}")
    else:
        print(json.dumps(out["rows"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
