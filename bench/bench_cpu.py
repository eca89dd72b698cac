"""Benchmark (not a test): CPU training efficiency of the default model, MFU and its largest waste.

In one run, on this machine:

1. **peak**: an fp32 matmul microbenchmark at the training thread count (and at 1 thread):
   the model's own forward shapes (``tokens = batch x context`` rows) and large square ones; the
   peak FLOP/s is the best of them;
2. **variants**: the training step of the default model (params.yaml top level: 4 layers,
   d = 128, context 128, batch 16), i.e. :func:`lmrepro.backprop.backprop_step` on batches from
   :func:`lmrepro.data.batches.sample_batch`, under candidate fixes measured side by side in
   interleaved rounds (every variant once per round, so drifting load hits all alike):
   torch's CPU default AdamW (per-tensor loop) vs ``foreach`` vs ``fused``, 1 vs 2 threads,
   ``torch.compile`` (its compile time reported separately), each with a per-phase breakdown
   (data, forward, backward, clip, optimizer);
3. **end to end**: :func:`lmrepro.baseline.trainer.train_single` itself with the old behaviour
   (``optimizer_impl="loop"``) and with the current defaults, same seed and steps; its own
   tokens/s (training steps only) and the achieved FLOP/s and MFU from
   :func:`lmrepro.model.train_flops_per_token`.

    /tmp/venv/bin/python bench/bench_cpu.py                      # ~5 minutes on 2 cores
    /tmp/venv/bin/python bench/bench_cpu.py --steps 10 --rounds 1 --e2e-steps 20   # quick

Writes ``bench/results/cpu.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "cpu.json"


def load_params() -> tuple[Any, Any]:
    """``(ModelConfig, BaselineConfig)`` of the default profile of params.yaml."""
    from lmrepro.pipeline.params import load_params
    from lmrepro.pipeline.registry import install
    from lmrepro.wings import WINGS

    install(WINGS)
    params = load_params(REPO / "params.yaml", "default")
    return params.model, params.train


def training_bytes() -> np.ndarray:
    """The embedded corpus when prepared/embedded, else a deterministic random stream."""
    for p in (REPO / "data" / "embedded" / "shakespeare.txt",):
        if p.is_file():
            return np.fromfile(p, dtype=np.uint8)
    return np.random.default_rng(0).integers(0, 256, 2_000_000, dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# 1. matmul peak
# ---------------------------------------------------------------------------------------------
def matmul_gflops(m: int, k: int, n: int, threads: int, min_time_s: float = 0.5) -> dict:
    """Best-of-repeats GFLOP/s of ``(m,k) @ (k,n)`` fp32 with ``out=`` (no allocation)."""
    from lmrepro.bench.flops import matmul_flops

    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.empty(m, n)
    torch.mm(a, b, out=c)
    reps = 1
    while True:                             # calibrate so one timing lasts >= 0.1 s
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        dt = time.perf_counter() - t0
        if dt >= 0.1:
            break
        reps *= 2
    best, spent = float("inf"), 0.0
    while spent < min_time_s:
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        dt = time.perf_counter() - t0
        best, spent = min(best, dt / reps), spent + dt
    return {"m": m, "k": k, "n": n, "threads": threads,
            "gflops": matmul_flops(m, k, n) / best / 1e9, "seconds_per_call": best}


def peak_benchmark(cfg: Any, batch: int, threads_list: list[int], quick: bool,
                   rounds: int = 3) -> dict:
    """Best GFLOP/s per shape over ``rounds`` interleaved passes over all shapes (2-thread
    matmul timings on this VM vary a lot from one second to the next; the best pass is the
    machine's capability, every pass is kept in the results)."""
    from lmrepro.bench.flops import model_matmul_shapes

    tokens = batch * cfg.context
    shapes = dict(model_matmul_shapes(cfg.d_model, cfg.mlp_ratio, tokens))
    for s in ((512, 1024) if quick else (512, 1024, 2048)):
        shapes[f"square{s}"] = (s, s, s)
    out: dict[str, Any] = {}
    for th in threads_list:
        passes: dict[str, list[dict]] = {name: [] for name in shapes}
        for _ in range(1 if quick else rounds):
            for name, mkn in shapes.items():
                passes[name].append(matmul_gflops(*mkn, threads=th,
                                                  min_time_s=0.3 if quick else 0.5))
        rows = {name: dict(max(ps, key=lambda r: r["gflops"]),
                           gflops_passes=[r["gflops"] for r in ps])
                for name, ps in passes.items()}
        model_rows = [r for n, r in rows.items() if not n.startswith("square")]
        out[str(th)] = {
            "rows": rows,
            "peak_gflops": max(r["gflops"] for r in rows.values()),
            "peak_square_gflops": max(r["gflops"] for n, r in rows.items()
                                      if n.startswith("square")),
            "model_shapes_gflops_flop_weighted": _flop_weighted(model_rows),
        }
        print(f"  matmul @ {th} thread(s), best of {len(next(iter(passes.values())))}: " +
              ", ".join(f"{n} {r['gflops']:.1f}" for n, r in rows.items()) + " GFLOP/s",
              flush=True)
    return out


def _flop_weighted(rows: list[dict]) -> float:
    """GFLOP/s of running each shape once: total FLOPs / total time."""
    flops = sum(2.0 * r["m"] * r["k"] * r["n"] for r in rows)
    secs = sum(r["seconds_per_call"] for r in rows)
    return flops / secs / 1e9


# ---------------------------------------------------------------------------------------------
# 2. training-step variants, interleaved
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Variant:
    """One candidate configuration of the training step."""

    name: str
    threads: int
    optimizer_impl: str
    compile: bool = False
    sdpa_backend: str = ""      # "" = torch's choice (flash kernel on CPU), or "math"
    note: str = ""


class StepRunner:
    """A model, its optimizer and batch generator under one :class:`Variant`; ``run(n)`` times
    ``n`` steps of :func:`lmrepro.backprop.backprop_step` with a per-phase breakdown."""

    def __init__(self, v: Variant, cfg: Any, s: Any, data: np.ndarray) -> None:
        from lmrepro.baseline.trainer import compiled_forward, make_optimizer
        from lmrepro.model import ByteTransformer

        self.v, self.cfg, self.data = v, cfg, data
        self.s = s.replace(threads=v.threads, optimizer_impl=v.optimizer_impl,
                                     compile=v.compile)
        torch.manual_seed(self.s.seed)
        self.model = ByteTransformer(cfg)
        self.opt = make_optimizer(self.model, self.s)
        self.forward = compiled_forward(self.model, self.s)
        self.gen = torch.Generator().manual_seed(self.s.seed)
        self.compile_s = 0.0
        self.step_times: list[float] = []
        self.phases = {k: 0.0 for k in ("data", "forward", "backward", "clip", "optimizer")}
        self.phase_steps = 0

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        from lmrepro.data.batches import sample_batch

        return sample_batch(self.data, self.s.batch_size, self.cfg.context, self.gen)

    def warm(self, n: int) -> None:
        """Untimed steps (the first ones compile under ``torch.compile``; that time is kept)."""
        from lmrepro.backprop import backprop_step

        torch.set_num_threads(self.v.threads)
        t0 = time.perf_counter()
        for _ in range(n):
            x, y = self._batch()
            backprop_step(self.forward, self.model, self.opt, x, y,
                          max_grad_norm=self.s.max_grad_norm)
        self.compile_s = time.perf_counter() - t0

    def run(self, n: int) -> None:
        """``n`` timed steps (whole step, as train_single times it), then ``n // 2`` more with
        the phase breakdown (the extra timers' own cost is kept out of the step times)."""
        import contextlib

        if self.v.sdpa_backend:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            ctx: Any = sdpa_kernel(getattr(SDPBackend, self.v.sdpa_backend.upper()))
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            self._run(n)

    def _run(self, n: int) -> None:
        from lmrepro.backprop import backprop_step
        from lmrepro.model import lm_loss

        torch.set_num_threads(self.v.threads)
        for _ in range(n):
            t0 = time.perf_counter()
            x, y = self._batch()
            backprop_step(self.forward, self.model, self.opt, x, y,
                          max_grad_norm=self.s.max_grad_norm)
            self.step_times.append(time.perf_counter() - t0)
        for _ in range(max(1, n // 2)):
            t0 = time.perf_counter()
            x, y = self._batch()
            t1 = time.perf_counter()
            loss = lm_loss(self.forward(x), y)
            t2 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            t3 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.max_grad_norm)
            t4 = time.perf_counter()
            self.opt.step()
            loss.item()
            t5 = time.perf_counter()
            for k, a, b in (("data", t0, t1), ("forward", t1, t2), ("backward", t2, t3),
                            ("clip", t3, t4), ("optimizer", t4, t5)):
                self.phases[k] += b - a
            self.phase_steps += 1

    def result(self, flops_per_token: float, peak: float) -> dict:
        from lmrepro.bench.flops import mfu
        from lmrepro.bench.timing import summarize

        tokens = self.s.batch_size * self.cfg.context
        st = summarize(self.step_times)
        tps = tokens / st["median_s"]
        return {**dataclasses.asdict(self.v), "step": st, "tokens_per_s": tps,
                "achieved_gflops": tps * flops_per_token / 1e9,
                "mfu": mfu(tps, flops_per_token, peak),
                "warmup_or_compile_s": self.compile_s,
                "phases_ms": {k: 1e3 * v / max(1, self.phase_steps)
                              for k, v in self.phases.items()}}


def run_variants(variants: list[Variant], cfg: Any, s: Any, data: np.ndarray, steps: int,
                 rounds: int, warm: int) -> list[StepRunner]:
    runners = []
    for v in variants:
        r = StepRunner(v, cfg, s, data)
        r.warm(warm if not v.compile else max(warm, 3))
        print(f"  {v.name}: warm-up {r.compile_s:.1f} s", flush=True)
        runners.append(r)
    for i in range(rounds):
        for r in runners:
            r.run(steps)
        print(f"  round {i + 1}/{rounds}: " + ", ".join(
            f"{r.v.name} {1e3 * float(np.median(r.step_times[-steps:])):.0f} ms"
            for r in runners), flush=True)
    return runners


# ---------------------------------------------------------------------------------------------
# 3. end to end through train_single
# ---------------------------------------------------------------------------------------------
def end_to_end(cfg: Any, s: Any, data: np.ndarray, steps: int, flops_per_token: float,
               peak: float, configs: dict[str, dict]) -> dict:
    from lmrepro.baseline.trainer import train_single
    from lmrepro.bench.flops import mfu

    cut = int(0.95 * len(data))
    out = {}
    for name, over in configs.items():
        st = s.replace(steps=steps, warmup_steps=min(s.warmup_steps, steps),
                       eval_every=10 ** 9, checkpoint_every=10 ** 9, eval_batches=2, **over)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            summ = train_single(cfg, st, data[:cut], data[cut:], tmp, name=name, progress=False)
            wall = time.perf_counter() - t0
        tps = summ["tokens_per_s"]
        out[name] = {"settings_override": over, "steps": steps, "tokens_per_s": tps,
                     "achieved_gflops": tps * flops_per_token / 1e9,
                     "mfu": mfu(tps, flops_per_token, peak), "wall_s": wall,
                     "final_bpb": summ["final_bpb"]}
        print(f"  train_single {name}: {tps:.0f} tokens/s, MFU {out[name]['mfu']:.3f}, "
              f"wall {wall:.1f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--e2e-steps", type=int, default=60)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile variants")
    ap.add_argument("--quick", action="store_true", help="shorter matmul timings")
    ap.add_argument("--json-out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    # A cold compile: torch.compile's on-disk caches would otherwise hide its real cost.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="lmrepro-inductor-")

    from lmrepro.bench.flops import counted_train_flops
    from lmrepro.bench.machine import busy_processes, load_average, machine_info
    from lmrepro.model import ByteTransformer, train_flops_per_token

    cfg, s = load_params()
    info = machine_info()
    info["busy_processes_at_start"] = busy_processes()
    load_start = load_average()
    data = training_bytes()
    th = s.threads
    print(f"bench_cpu: {info['cpu_model']}, {info['logical_cores']} cores, torch "
          f"{info['torch']}; model {cfg}; batch {s.batch_size}; train.threads {th}; "
          f"load {load_start}", flush=True)
    fpt = train_flops_per_token(cfg)
    torch.manual_seed(0)
    x = torch.randint(0, 256, (s.batch_size, cfg.context))
    counted = counted_train_flops(ByteTransformer(cfg), x, x) / x.numel()

    t_begin = time.perf_counter()
    peak = peak_benchmark(cfg, s.batch_size, sorted({1, th}), args.quick)
    peak_flops = peak[str(th)]["peak_gflops"] * 1e9

    variants = [
        Variant("loop_t2", th, "loop", note="torch's CPU default AdamW: the code before the fix"),
        Variant("foreach_t2", th, "foreach"),
        Variant("fused_t2", th, "fused"),
        Variant("loop_t1", 1, "loop"),
        Variant("foreach_t1", 1, "foreach"),
        Variant("foreach_mathsdpa_t2", th, "foreach", sdpa_backend="math",
                note="attention through the math SDPA backend instead of the CPU flash kernel"),
    ]
    if not args.no_compile:
        variants += [Variant("compile_foreach_t2", th, "foreach", compile=True)]
    for v in variants:
        v.name = v.name.replace("_t2", f"_t{th}")
    runners = run_variants(variants, cfg, s, data, args.steps, args.rounds, args.warmup)
    rows = [r.result(fpt, peak[str(r.v.threads)]["peak_gflops"] * 1e9) for r in runners]
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["speedup_vs_loop"] = r["tokens_per_s"] / base
        r["mfu_vs_peak_at_train_threads"] = r["achieved_gflops"] * 1e9 / peak_flops

    from lmrepro.baseline.config import BaselineConfig

    default_impl = BaselineConfig.model_fields["optimizer_impl"].default
    default_compile = BaselineConfig.model_fields["compile"].default
    e2e = end_to_end(cfg, s, data, args.e2e_steps, fpt, peak_flops, {
        "before_fix_loop": {"optimizer_impl": "loop", "compile": False},
        "after_fix_defaults": {"optimizer_impl": default_impl, "compile": default_compile},
    })
    e2e["gain"] = e2e["after_fix_defaults"]["tokens_per_s"] / \
        e2e["before_fix_loop"]["tokens_per_s"]

    result = {
        "benchmark": "cpu", "machine": info, "args": vars(args),
        "model": cfg.to_dict(), "batch_size": s.batch_size, "train_threads": th,
        "tokens_per_step": s.batch_size * cfg.context,
        "flops_per_token_model": fpt, "flops_per_token_counted_matmul_only": counted,
        "peak": peak, "peak_gflops_at_train_threads": peak[str(th)]["peak_gflops"],
        "variants": rows, "end_to_end": e2e,
        "defaults": {"optimizer_impl": default_impl, "compile": default_compile},
        "loadavg_start": load_start, "loadavg_end": load_average(),
        "busy_processes_at_end": busy_processes(), "wall_s": time.perf_counter() - t_begin,
    }
    print(f"\n{'variant':22s} {'ms/step':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'MFU':>6s} "
          f"{'x loop':>7s}  phases ms (data/fwd/bwd/clip/opt)")
    for r in rows:
        ph = r["phases_ms"]
        print(f"{r['name']:22s} {r['step']['median_s'] * 1e3:8.1f} {r['tokens_per_s']:9.0f} "
              f"{r['achieved_gflops']:8.2f} {r['mfu']:6.3f} {r['speedup_vs_loop']:7.2f}  "
              + "/".join(f"{ph[k]:.1f}" for k in ("data", "forward", "backward", "clip",
                                                  "optimizer")))
    print(f"end to end: {e2e['gain']:.2f}x tokens/s with the defaults "
          f"(optimizer_impl={default_impl}, compile={default_compile})")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
