"""The GPU check of the SCAPE wing (``scripts/gpu-check.sh``): one short torchrun job that, on the
device it is given (CUDA with NCCL; ``--device cpu`` with gloo for a dry run of the same code):

1. checks the CUDA code paths of the optimizer library against their CPU twins (``torch.topk``
   against ``numpy.argpartition``, the bit packing) and an NCCL all-reduce and asynchronous
   all-gather;
2. checks that SCAPE at sparsity 0 without bias correction equals dense AdamS on the averaged
   gradient, on the device, to 1e-5;
3. trains the byte-level model for a few steps with dense AdamW, dense AdamS, SCAPE 90 % and
   99 % and top-k 99 % exactly as ``train-scape`` builds them, and prints each method's median
   step time (CUDA-synchronised) and bytes per step.

Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from lmrepro.distributed import init_from_env, shutdown
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.optim import SCAPE, AdamS, DenseDP
from lmrepro.optim.comm import pack_bits, topk_indices, unpacked_indices
from lmrepro.scape.config import ScapeConfig, ScapeRun
from lmrepro.scape.train.trainer import build_optimizer

METHODS = (("adamw", 0.0), ("adams", 0.0), ("scape", 0.9), ("scape", 0.99), ("topk", 0.99))


def check_kernels(dev: torch.device) -> list[str]:
    """Failures of the device paths against the CPU ones (empty: all agree)."""
    bad = []
    gen = torch.Generator().manual_seed(0)
    score = torch.randn(100_003, generator=gen).abs()
    for k in (1, 1000, 10_000):
        if not torch.equal(topk_indices(score.to(dev), k).cpu(), topk_indices(score, k)):
            bad.append(f"topk_indices k={k}: device and CPU differ")
    bits = torch.rand(10_001, generator=gen) < 0.1
    if not torch.equal(pack_bits(bits.to(dev)).cpu(), pack_bits(bits)):
        bad.append("pack_bits: device and CPU differ")
    idx = unpacked_indices(pack_bits(bits).to(dev), bits.numel()).cpu()
    if not torch.equal(idx, bits.nonzero().squeeze(1)):
        bad.append("unpacked_indices on the device does not invert pack_bits")
    if dist.is_initialized():
        x = torch.arange(8, dtype=torch.float32, device=dev)
        dist.all_reduce(x)
        out = torch.empty(8 * dist.get_world_size(), device=dev)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        work = gather(out, x, async_op=True)
        work.wait()
        w = dist.get_world_size()
        if not torch.equal(out.cpu(), (torch.arange(8.0) * w).repeat(w)):
            bad.append("all-reduce / async all-gather returned wrong values")
    return bad


def check_sparsity_zero(dev: torch.device, rank: int, world: int) -> float:
    """Max |SCAPE(sparsity 0, no bias correction) - AdamS on the mean gradient| after 5 steps."""
    shapes = [(64, 48), (48,), (32, 64)]
    gen = torch.Generator().manual_seed(1)
    init = [torch.randn(s, generator=gen) for s in shapes]
    ps = [t.clone().to(dev).requires_grad_(True) for t in init]
    qs = [t.clone().to(dev).requires_grad_(True) for t in init]
    hp = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = SCAPE(ps, sparsity=0.0, bias_correction=False, **hp)
    ref = DenseDP(AdamS(qs, **hp))
    diff = 0.0
    for t in range(5):
        g = torch.Generator().manual_seed(100 * t + rank)
        grads = [torch.randn(s, generator=g).to(dev) for s in shapes]
        for p, q, x in zip(ps, qs, grads):
            p.grad, q.grad = x.clone(), x.clone()
        opt.step()
        ref.step()
        diff = max(diff, max(float((p - q).detach().abs().max()) for p, q in zip(ps, qs)))
    return diff


def time_methods(dev: torch.device, steps: int, model_cfg: ModelConfig, batch: int
                 ) -> list[dict[str, Any]]:
    rows = []
    cfg = ScapeConfig(steps=steps, batch_size=batch, lr=1e-3, warmup_steps=0)
    for optimizer, sparsity in METHODS:
        torch.manual_seed(0)
        model = ByteTransformer(model_cfg).to(dev)
        run = ScapeRun(optimizer=optimizer, sparsity=sparsity)
        opt = build_optimizer(cfg, run, model)
        gen = torch.Generator().manual_seed(7)
        times, losses = [], []
        for i in range(steps):
            x = torch.randint(0, 256, (batch, model_cfg.context + 1), generator=gen).to(dev)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            loss = lm_loss(model(x[:, :-1]), x[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if i >= 2:
                times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
        rows.append({"method": run.run_name, "step_ms": 1e3 * statistics.median(times),
                     "bytes": opt.comm_stats(), "first_loss": losses[0],
                     "last_loss": losses[-1]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    args = ap.parse_args(argv)
    ctx = init_from_env(timeout_s=120, device=args.device)
    dev = ctx.device
    failures: list[str] = []
    try:
        if ctx.is_main:
            name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
            print(f"gpu-check: device {dev} ({name}), backend {ctx.backend}, world "
                  f"{ctx.world_size}, torch {torch.__version__}", flush=True)
        failures += check_kernels(dev)
        diff = check_sparsity_zero(dev, ctx.rank, ctx.world_size)
        if diff > 1e-5:
            failures.append(f"SCAPE at sparsity 0 differs from AdamS by {diff:.3g} (> 1e-5)")
        rows = time_methods(dev, args.steps, ModelConfig(n_layers=args.layers,
                                                         d_model=args.d_model, n_heads=4,
                                                         context=128), args.batch)
        if ctx.is_main:
            print(f"sparsity 0 vs AdamS on the averaged gradient: max |diff| = {diff:.3g}")
            print(f"{'method':<10}{'step ms':>10}{'grad B':>12}{'mask B':>10}{'total B':>12}"
                  f"{'loss first -> last':>22}")
            for r in rows:
                b = r["bytes"]
                print(f"{r['method']:<10}{r['step_ms']:>10.2f}{b['grad_values']:>12}"
                      f"{b['mask']:>10}{b['total']:>12}"
                      f"{r['first_loss']:>12.3f} -> {r['last_loss']:.3f}")
            for r in rows:
                if not r["last_loss"] < r["first_loss"]:
                    failures.append(f"{r['method']}: the loss did not decrease")
            print("gpu-check: " + ("PASS" if not failures else "FAIL\n  " +
                                   "\n  ".join(failures)), flush=True)
    finally:
        shutdown(ctx)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
