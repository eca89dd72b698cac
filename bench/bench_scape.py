"""Benchmark (not a test): per-step wall time and bytes of dense data-parallel AdamS vs SCAPE.

Spawns ``--world`` gloo workers on 127.0.0.1 training the same ByteTransformer (a few M
parameters, small batches so communication matters), each method in turn inside the same worker
processes, and prints per method: mean full-step time, mean ``opt.step()`` time (gradient
communication + update + parameter exchange), bytes handed to collectives per step by kind
(``comm_stats()``, steady state after the warm-up steps), and the dense / SCAPE ratios measured in
this run.

    python bench/bench_scape.py --world 2 --d-model 256 --layers 4 --steps 20

On one machine over loopback, gloo moves bytes at memory speed, so the byte ratio is the
portable result and the time ratio mostly reflects the extra indexing work of the sparse path;
across real networks the time saved scales with the bytes saved (arXiv 2607.01678).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lmrepro.distributed import free_port
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.scape.config import ScapeConfig, ScapeRun
from lmrepro.scape.train.trainer import build_optimizer


def _build(method: str, model: torch.nn.Module, lr: float):
    """The optimizer of ``method`` exactly as ``train-scape`` builds it (same groups, clipping,
    bias correction): ``adamw``, ``adams``, ``scape<percent>``, ``topk<percent>``."""
    cfg = ScapeConfig(steps=1, batch_size=1, lr=lr, warmup_steps=0)
    if method in ("adamw", "adams"):
        return build_optimizer(cfg, ScapeRun(optimizer=method), model)
    for name in ("scape", "topk"):
        if method.startswith(name):
            run = ScapeRun(optimizer=name, sparsity=int(method[len(name):]) / 100)
            return build_optimizer(cfg, run, model)
    raise ValueError(method)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                      context=args.context)
    results = {}
    for method in args.methods.split(","):
        torch.manual_seed(0)
        model = ByteTransformer(cfg)
        opt = _build(method, model, args.lr)
        gen = torch.Generator().manual_seed(100 + rank)
        step_t, opt_t, stats = [], [], []
        for step in range(args.warmup_steps + args.steps):
            x = torch.randint(0, 256, (args.batch, args.context), generator=gen)
            dist.barrier()
            t0 = time.perf_counter()
            loss = lm_loss(model(x[:, :-1]), x[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            if step >= args.warmup_steps:
                step_t.append(t2 - t0)
                opt_t.append(t2 - t1)
                stats.append(opt.comm_stats())
        results[method] = {
            "params": model.num_parameters(),
            "step_ms": 1e3 * statistics.median(step_t),
            "opt_ms": 1e3 * statistics.median(opt_t),
            "bytes": {k: statistics.mean(s[k] for s in stats) for k in stats[0]},
        }
    if rank == 0:
        q.put(results)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--methods", default="adamw,adams,scape90,scape99,topk99")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, args.world, port, args, q))
             for r in range(args.world)]
    for p in procs:
        p.start()
    results = q.get(timeout=1800)
    for p in procs:
        p.join()
    n = next(iter(results.values()))["params"]
    print(f"bench_scape: world {args.world} (gloo, 127.0.0.1), ByteTransformer {args.layers}x"
          f"{args.d_model}, {n / 1e6:.2f} M params, batch {args.batch}x{args.context} per worker, "
          f"{args.steps} timed steps after {args.warmup_steps} (median times; bytes handed to "
          f"collectives per rank per step)")
    head = f"{'method':<12}{'step ms':>10}{'opt.step ms':>13}{'grad B':>12}{'param B':>12}" \
           f"{'mask B':>10}{'total B':>12}"
    print(head)
    print("-" * len(head))
    for m, r in results.items():
        b = r["bytes"]
        print(f"{m:<12}{r['step_ms']:>10.1f}{r['opt_ms']:>13.1f}{b['grad_values']:>12.0f}"
              f"{b['param_values']:>12.0f}{b['mask']:>10.0f}{b['total']:>12.0f}")
    if "adamw" in results:
        d = results["adamw"]
        for m, r in results.items():
            if m == "adamw":
                continue
            print(f"adamw / {m}: bytes x{d['bytes']['total'] / r['bytes']['total']:.1f}, "
                  f"step time x{d['step_ms'] / r['step_ms']:.2f}, "
                  f"opt.step time x{d['opt_ms'] / r['opt_ms']:.2f}")


if __name__ == "__main__":
    main()
