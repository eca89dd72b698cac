"""Benchmark (not a test): the cost table that sizes RGC's training-length study.

For each candidate model size (the ``rgc`` section's context, batch, micro-batches and 4 stages)
and each executor the study runs (``sync`` RGC, which computes what ``async`` does, and global
``backprop``), trains ``--steps`` steps on 1 intra-op thread, ``--repeats`` times, on the
embedded corpus, and prints steps/s (median and range over the repeats; the first step of each
repeat is excluded by the harness's clock). The study trains 2 such runs at once on 2 cores,
so its throughput is about twice one run's (measured here too, with ``--pair``: two runs
started together). ``--horizons 1 2 4`` adds sync RGC at those horizons (the horizon study's
runs; docs/rgc.md, "Quality against the horizon").

    python bench/bench_rgc_cost.py                      # -> bench/results/rgc_cost.json
    python bench/bench_rgc_cost.py --sizes 4x64 8x64 --horizons 1 2 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = {"4x64": (4, 64, 2), "4x96": (4, 96, 4), "8x64": (8, 64, 2), "8x128": (8, 128, 4)}


def one(size: str, executor: str, steps: int, horizon: int = 1) -> float:
    """Steps per second of one run (training clock)."""
    import numpy as np
    import torch

    from lmrepro.data.prepare import load_split
    from lmrepro.model import ModelConfig
    from lmrepro.rgc import RGCConfig, train

    torch.set_num_threads(1)
    layers, width, heads = SIZES[size]
    cfg = RGCConfig(model=ModelConfig(n_layers=layers, d_model=width, n_heads=heads, context=128),
                    n_stages=4, horizon=horizon, batch_size=16, micro_batches=4, steps=steps,
                    warmup_steps=1,
                    eval_batches=1, eval_batch_size=8, checkpoint_every=0,
                    backprop_threads=1)
    root = REPO / "data" / "prepared" / "shakespeare"
    res = train(cfg, executor, np.asarray(load_split(root, "train")),
                np.asarray(load_split(root, "val")), seed=0)
    return res.tokens_per_s / (cfg.batch_size * cfg.model.context)


def _one_star(args: tuple[str, str, int, int]) -> float:
    return one(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES))
    ap.add_argument("--horizons", nargs="+", type=int, default=[1],
                    help="sync RGC's horizons (backprop has none)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "rgc_cost.json"))
    args = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    rows = []
    with ctx.Pool(2) as pool:
        for size in args.sizes:
            for executor, h in [("sync", h) for h in args.horizons] + [("backprop", 1)]:
                alone = [pool.apply(one, (size, executor, args.steps, h))
                         for _ in range(args.repeats)]
                t0 = time.perf_counter()
                pair = pool.map(_one_star, [(size, executor, args.steps, h)] * 2)
                pair_wall = time.perf_counter() - t0
                row = {"size": size, "executor": executor, "horizon": h, "steps": args.steps,
                       "steps_per_s": statistics.median(alone), "min": min(alone),
                       "max": max(alone), "repeats": alone,
                       "pair_steps_per_s_each": pair, "pair_wall_s": pair_wall}
                rows.append(row)
                print(f"{size:6s} {executor:8s} H{h} alone {row['steps_per_s']:6.2f} steps/s "
                      f"[{row['min']:.2f}, {row['max']:.2f}] (n={args.repeats}); two at once "
                      f"{pair[0]:.2f} + {pair[1]:.2f}", flush=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "threads": 1,
                                          "batch": "16 x 128, 4 micro-batches, 4 stages"},
                                         indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
