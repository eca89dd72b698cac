"""Benchmark (not a test; needs root): SCAPE vs dense AdamW over a really bandwidth-limited link.

The benchmark creates its own Linux network namespace ``lmrepro-bench-<pid>``, brings its
loopback up (127.0.0.1 only; IPv6 off), and for each link setting (unlimited, then e.g. 1 Gbit/s
and 100 Mbit/s via ``tc qdisc replace dev lo root tbf rate ...``) runs ONE ``torchrun`` job of 2
gloo workers inside it (``ip netns exec NS python -m torch.distributed.run ...``, rendezvous and
gloo on 127.0.0.1). Every worker uses 1 intra-op thread (2 workers = the 2 cores). In that job:

1. an alpha-beta sweep: all-reduce, all-gather and a ping-pong over message sizes up to the dense
   gradient's size, timed on rank 0;
2. for dense AdamW (``DenseDP(AdamW)``), SCAPE 90 % and SCAPE 99 % (:class:`lmrepro.optim.SCAPE`),
   each built exactly as ``train-scape`` builds it
   (:func:`lmrepro.scape.train.trainer.build_optimizer`: weight-decay groups, clipping, bias
   correction):
   * ``compute``: the same training steps with every collective replaced by a local stand-in of
     the right shape (the optimizer's own ``Comm`` methods are swapped on the instance), i.e. the
     step's compute measured without communication;
   * ``real``: the real steps. Every (method, mode) runs one block of steps per round, in
     turn, so machine drift hits all alike. Steps run back to back (no per-step barrier, which
     would drain SCAPE's asynchronous mask all-gather); the step time is the wall time of the
     block of timed steps, barrier to barrier, divided by their number, the slower rank's.
   Optimizer phases are timed from outside by wrapping the optimizer instance's methods
   (gradient gather, the owner's top-k, the mask launch and decode, the update) and the work
   handles of its collectives (the wait for the payload all-reduce and for the mask all-gather:
   the latter, against the all-gather's time on the link, shows the overlap).

The parent fits ``t = alpha + beta * bytes`` per collective on each link, predicts each method's
ideal step (compute + blocking collectives + any part of the asynchronous mask all-gather not
hidden behind forward/backward), and reports measured vs ideal speedups over dense AdamW, SCAPE
99 %'s step over dense AdamW's on the unlimited link (target <= 1.05), and SCAPE's mask overhead
(top-k + encode + decode) as a fraction of the unlimited-link step. The namespace is deleted at
the end, also on an error or Ctrl-C.

    sudo python bench/bench_scape_netns.py                       # defaults
    sudo python bench/bench_scape_netns.py --rates 100 --steps 4 # quicker
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "scape_netns.json"
METHODS = ("adamw", "scape90", "scape99")
SWEEP_KINDS = ("all_reduce", "all_gather", "pingpong")
MASTER_PORT = 29517


# =============================================================================================
# worker side (runs under torchrun inside the namespace)
# =============================================================================================
def _method_config(method: str, lr: float) -> tuple[Any, Any]:
    """``(ScapeConfig, ScapeRun)`` of a benchmark method (``adamw`` or ``scape<percent>``)."""
    from lmrepro.scape.config import ScapeConfig, ScapeRun

    cfg = ScapeConfig(steps=1, batch_size=1, lr=lr, warmup_steps=0)
    if method == "adamw":
        return cfg, ScapeRun(optimizer="adamw")
    return cfg, ScapeRun(optimizer="scape", sparsity=int(method[len("scape"):]) / 100)


def _sweep(kind: str, sizes: list[int], repeats: int, rank: int, world: int) -> list[list[float]]:
    """Rank 0's seconds per call of ``kind`` for each message size (bytes handed in per rank)."""
    import torch
    import torch.distributed as dist

    out = []
    for nbytes in sizes:
        n = max(world, nbytes // 4 // world * world)
        x = torch.ones(n)
        if kind == "reduce_scatter":
            dst = torch.empty(n // world)
        elif kind == "all_gather":
            dst = torch.empty(n * world)
        times = []
        for rep in range(repeats + 1):          # first call: warm-up (connection, buffers)
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "all_reduce":
                dist.all_reduce(x)
            elif kind == "reduce_scatter":
                dist.reduce_scatter_tensor(dst, x)
            elif kind == "all_gather":
                dist.all_gather_into_tensor(dst, x)
            else:                                 # ping-pong: one way = half the round trip
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(x, 1)
                elif rank == 1:
                    dist.recv(x, 0)
                    dist.send(x, 0)
            dt = time.perf_counter() - t0
            if kind == "pingpong":
                dt /= 2
            if rep:
                times.append(dt)
        out.append(times)
    return out


class _TimedWork:
    """A collective's work handle whose ``wait()`` is timed under ``label``."""

    def __init__(self, work: Any, timer: Any, label: str) -> None:
        self.work, self.timer, self.label = work, timer, label

    def wait(self) -> Any:
        with self.timer.phase(self.label):
            return self.work.wait()


class _Instrument:
    """Times an optimizer's phases from outside (its methods wrapped on the instance; the optim
    files are not modified) and optionally removes its communication."""

    def __init__(self, opt: Any, compute_only: bool, world: int) -> None:
        from lmrepro.bench.timing import PhaseTimer
        from lmrepro.optim import SCAPE

        self.timer = PhaseTimer()
        self.opt = opt
        self.world = world
        comm = opt.comm
        t = self.timer
        if compute_only:
            comm.all_reduce_ = t.wrap("coll_all_reduce", self._fake_all_reduce(comm))
            comm.all_gather = self._timed_ag(self._fake_ag(comm))
        else:
            comm.all_reduce_ = self._timed_ar(comm.all_reduce_)
            comm.all_gather = self._timed_ag(comm.all_gather)
        if isinstance(opt, SCAPE):
            opt.flat.gather_grads = t.wrap("gather_grads", opt.flat.gather_grads)
            opt._select_owned = t.wrap("mask_topk", opt._select_owned)
            opt._launch_mask = t.wrap("mask_launch", opt._launch_mask)
            opt._decode = t.wrap("mask_decode_incl_wait", opt._decode)
            opt._apply_update = t.wrap("update", opt._apply_update)
        else:                                     # DenseDP: inner optimizer step
            inner = opt.optimizer
            inner.step = t.wrap("inner_step", inner.step)

    def _timed_ar(self, fn: Any) -> Any:
        t = self.timer

        def ar(x: Any, kind: str, async_op: bool = False) -> Any:
            with t.phase("coll_all_reduce_issue" if async_op else "coll_all_reduce"):
                work = fn(x, kind, async_op=async_op)
            return _TimedWork(work, t, "payload_wait") if work is not None else None
        return ar

    def _timed_ag(self, fn: Any) -> Any:
        t = self.timer

        def ag(inp: Any, kind: str, async_op: bool = False) -> Any:
            label = "coll_all_gather_mask_issue" if async_op else f"coll_all_gather_{kind}"
            with t.phase(label):
                out, work = fn(inp, kind, async_op=async_op)
            return out, (_TimedWork(work, t, "mask_wait") if work is not None else None)
        return ag

    def _fake_all_reduce(self, comm: Any) -> Any:
        def f(x: Any, kind: str, async_op: bool = False) -> Any:
            comm._count(x, kind)
            return None
        return f

    def _fake_ag(self, comm: Any) -> Any:
        world = self.world

        def f(inp: Any, kind: str, async_op: bool = False) -> Any:
            comm._count(inp, kind)
            return inp.repeat(world), None
        return f

def _run_methods(methods: list[str], args: argparse.Namespace, rank: int, world: int
                 ) -> list[dict[str, Any]]:
    """Compute-only and real steps of every method, interleaved: ``args.rounds`` rounds, each
    running one block of ``args.steps`` steps of every (method, mode) in turn, so drifting
    machine speed (other jobs on a shared machine) hits every method and mode alike. The step
    time of a (method, mode) is the median over rounds of (block wall time of the slower rank /
    steps). Returns one result per method and mode."""
    import torch
    import torch.distributed as dist

    from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
    from lmrepro.scape.train.trainer import build_optimizer

    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                      context=args.context)
    gen = torch.Generator().manual_seed(1000 + rank)
    batches = [torch.randint(0, 256, (args.batch, args.context + 1), generator=gen)
               for _ in range(4)]
    blocks: dict[tuple[str, str], dict[str, Any]] = {}
    for method in methods:
        for mode in ("compute", "real"):
            torch.manual_seed(0)
            model = ByteTransformer(cfg)
            opt = build_optimizer(*_method_config(method, args.lr), model)
            blocks[(method, mode)] = {
                "model": model, "opt": opt,
                "inst": _Instrument(opt, compute_only=(mode == "compute"), world=world),
                "fb": [], "st": [], "blocks": []}

    def one_step(m: dict, i: int) -> None:
        xy = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = lm_loss(m["model"](xy[:, :-1]), xy[:, 1:])
        m["opt"].zero_grad(set_to_none=True)
        loss.backward()
        t1 = time.perf_counter()
        m["opt"].step()
        m["fb"].append(t1 - t0)
        m["st"].append(time.perf_counter() - t1)

    for m in blocks.values():
        for i in range(args.warmup):
            one_step(m, i)
        m["fb"].clear()
        m["st"].clear()
        m["inst"].timer.reset()
    for _ in range(args.rounds):
        for m in blocks.values():
            dist.barrier()      # also completes the previous block's in-flight mask gather
            t_start = time.perf_counter()
            for i in range(args.steps):
                one_step(m, i)
            dist.barrier()
            block = torch.tensor([time.perf_counter() - t_start], dtype=torch.float64)
            dist.all_reduce(block, op=dist.ReduceOp.MAX)
            m["blocks"].append(float(block.item()) / args.steps)
    out = []
    n_steps = args.rounds * args.steps
    for (method, mode), m in blocks.items():
        opt = m["opt"]
        out.append({
            "method": method, "mode": mode, "steps": n_steps, "rounds": args.rounds,
            "step_s": float(np.median(m["blocks"])), "block_step_s": m["blocks"],
            "fwd_bwd_s": float(np.mean(m["fb"])), "opt_step_s": float(np.mean(m["st"])),
            "per_step_s": [a + b for a, b in zip(m["fb"], m["st"])],
            "phases_s": m["inst"].timer.per_call(n_steps),
            "bytes": {k: int(v) for k, v in opt.comm_stats().items()},
            "n_params": m["model"].num_parameters(),
            "sparsity": getattr(opt, "sparsity", None),
            "mask_kind": (opt.mask_encoding(opt.sparsity)[0]
                          if hasattr(opt, "mask_encoding") else None),
            "owned": ([s.numel for s in opt.slots if s.owner == rank]
                      if hasattr(opt, "slots") else None),
        })
    return out


def worker_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict[str, Any] = {"world": world, "sweep": {}, "runs": []}
    try:
        if not args.skip_sweep:
            sizes = [int(s) for s in args.sweep_sizes.split(",")]
            result["sweep_sizes"] = sizes
            for kind in SWEEP_KINDS:
                result["sweep"][kind] = _sweep(kind, sizes, args.sweep_repeats, rank, world)
                if rank == 0:
                    med = [float(np.median(t)) * 1e3 for t in result["sweep"][kind]]
                    print(f"  sweep {kind:15s} ms: " + " ".join(f"{m:.2f}" for m in med),
                          flush=True)
        for r in _run_methods(args.methods.split(","), args, rank, world):
            result["runs"].append(r)
            if rank == 0:
                print(f"  {r['method']:8s} {r['mode']:8s} step {r['step_s'] * 1e3:9.1f} ms "
                      f"(fwd/bwd {r['fwd_bwd_s'] * 1e3:.1f}, opt.step "
                      f"{r['opt_step_s'] * 1e3:.1f}) bytes {r['bytes']['total']}", flush=True)
        if rank == 0:
            Path(args.worker_out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


# =============================================================================================
# parent side: namespace, shaping, launch, analysis
# =============================================================================================
def _launch(ns: Any, args: argparse.Namespace, out_json: Path, skip_sweep: bool) -> dict:
    worker = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
              "--nproc-per-node", str(args.world), "--master-addr", "127.0.0.1",
              "--master-port", str(MASTER_PORT), str(Path(__file__).resolve()), "--worker",
              "--worker-out", str(out_json), "--layers", str(args.layers), "--d-model",
              str(args.d_model), "--heads", str(args.heads), "--context", str(args.context),
              "--batch", str(args.batch), "--steps", str(args.steps), "--rounds",
              str(args.rounds), "--warmup",
              str(args.warmup), "--lr", str(args.lr), "--methods", args.methods,
              "--sweep-sizes", args.sweep_sizes, "--sweep-repeats", str(args.sweep_repeats)]
    if skip_sweep:
        worker.append("--skip-sweep")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               TORCHELASTIC_ERROR_FILE=str(out_json.with_suffix(".err")))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"),
                                                      env.get("PYTHONPATH")]))
    proc = subprocess.Popen([*ns.exec_prefix(), *worker], env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=args.timeout_s)
    except BaseException:
        # torchrun forwards SIGTERM to its workers; anything left is killed when the namespace
        # is deleted (ShapedNamespace.delete kills the pids still inside it).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    if rc != 0 or not out_json.exists():
        raise RuntimeError(f"torchrun inside {ns.name} exited with status {rc}")
    return json.loads(out_json.read_text())


def _sweep_fits(sweep: dict[str, list[list[float]]], sizes: list[int], min_bytes: int
                ) -> dict[str, Any]:
    """Per collective: relative least-squares line through the per-size medians of the sizes
    >= ``min_bytes``. Smaller messages fit inside the token bucket's burst and pass at memory
    speed, off the line; every message the methods send is above the default 64 KiB."""
    from lmrepro.bench.alphabeta import fit_alpha_beta

    fits = {}
    for kind, per_size in sweep.items():
        pts = [(s, float(np.median(ts))) for s, ts in zip(sizes, per_size) if s >= min_bytes]
        fits[kind] = fit_alpha_beta([p[0] for p in pts], [p[1] for p in pts], relative=True)
    return fits


def _small_message_latency(sweep: dict[str, list[list[float]]], sizes: list[int]
                           ) -> dict[str, float]:
    """Median seconds of the smallest swept message, per collective (measured latency)."""
    i = int(np.argmin(sizes))
    return {kind: float(np.median(per[i])) for kind, per in sweep.items()}


def _collectives(method: str, b: dict[str, int]) -> tuple[list[tuple[str, float]],
                                                             list[tuple[str, float]]]:
    """(blocking, asynchronous) collectives of one steady-state step: (sweep kind, bytes)."""
    if method == "adamw":
        return [("all_reduce", b["grad_values"])], []
    return [("all_reduce", b["grad_values"])], [("all_gather", b["mask"])]


def analyse_link(res: dict, fits: dict[str, Any]) -> dict[str, Any]:
    """Ideal vs measured step times and speedups over dense AdamW on one link.

    ``ideal`` prices each collective with its own fit (gloo's algorithms as they are);
    ``link_limit`` prices the bytes a bandwidth-optimal algorithm would put on the link with the
    ping-pong fit (the link's own limit)."""
    from lmrepro.bench.alphabeta import (comm_time, fraction_of_ideal, ideal_step_time,
                                         link_limit_comm_time, speedup)

    runs = {(r["method"], r["mode"]): r for r in res["runs"]}
    methods = sorted({r["method"] for r in res["runs"]}, key=METHODS.index)
    rows: dict[str, Any] = {}
    for m in methods:
        comp, real = runs[(m, "compute")], runs[(m, "real")]
        blocking, asynchronous = _collectives(m, real["bytes"])
        t_block = comm_time(fits, blocking)
        t_async = comm_time(fits, asynchronous)
        ideal = ideal_step_time(comp["step_s"], t_block, t_async, comp["fwd_bwd_s"])
        world = int(res.get("world", 2))
        link_limit = ideal_step_time(
            comp["step_s"], link_limit_comm_time(fits["pingpong"], blocking, world),
            link_limit_comm_time(fits["pingpong"], asynchronous, world), comp["fwd_bwd_s"])
        rows[m] = {
            "link_limit_step_s": link_limit,
            "measured_step_s": real["step_s"], "compute_step_s": comp["step_s"],
            "compute_fwd_bwd_s": comp["fwd_bwd_s"], "pred_blocking_comm_s": t_block,
            "pred_async_comm_s": t_async, "ideal_step_s": ideal,
            "ideal_step_serial_s": comp["step_s"] + t_block + t_async,
            "measured_over_ideal": real["step_s"] / ideal,
            "bytes_per_step": real["bytes"],
        }
    for m, r in rows.items():
        _, asynchronous = _collectives(m, r["bytes_per_step"])
        r["mask_allgather_pred_s"] = comm_time(fits, asynchronous) if asynchronous else 0.0
    if "adamw" in rows:
        base = rows["adamw"]
        for m, r in rows.items():
            if m == "adamw":
                continue
            r["measured_speedup"] = speedup(base["measured_step_s"], r["measured_step_s"])
            r["ideal_speedup"] = speedup(base["ideal_step_s"], r["ideal_step_s"])
            r["fraction_of_ideal"] = fraction_of_ideal(r["measured_speedup"], r["ideal_speedup"])
            r["link_limit_speedup"] = speedup(base["link_limit_step_s"], r["link_limit_step_s"])
            r["step_over_adamw"] = r["measured_step_s"] / base["measured_step_s"]
    return rows


def _smallest_priced(rows: dict[str, Any]) -> int:
    sizes = [v for r in rows.values() for v in r["bytes_per_step"].values() if v > 0]
    return int(min(sizes)) if sizes else 0


def mask_overhead(res: dict) -> dict[str, Any]:
    """SCAPE's mask work per step (top-k, encoding, decoding; the wait for the all-gather
    apart), its local optimizer work, and the overlap of the mask all-gather: the time a step
    actually waited for it against the time it takes on the link (``mask_allgather_pred_s``,
    filled in by :func:`analyse_link`)."""
    out = {}
    for r in res["runs"]:
        if r["mode"] != "real" or not r["method"].startswith("scape"):
            continue
        ph = r["phases_s"]
        issue = ph.get("coll_all_gather_mask_issue", 0.0)
        topk = ph.get("mask_topk", 0.0)
        encode = max(0.0, ph.get("mask_launch", 0.0) - topk - issue)
        decode = max(0.0, ph.get("mask_decode_incl_wait", 0.0) - ph.get("mask_wait", 0.0))
        mask_s = topk + encode + decode
        coll = sum(v for k, v in ph.items() if k.startswith("coll_"))
        local_opt = r["opt_step_s"] - coll - ph.get("payload_wait", 0.0) \
            - ph.get("mask_wait", 0.0)
        out[r["method"]] = {
            "step_s": r["step_s"], "mask_s": mask_s, "mask_fraction": mask_s / r["step_s"],
            "mask_phases_s": {"mask_topk": topk, "mask_encode": encode, "mask_decode": decode},
            "mask_wait_s": ph.get("mask_wait", 0.0),
            "payload_wait_s": ph.get("payload_wait", 0.0),
            "optimizer_local_s": local_opt,
            "optimizer_local_fraction": local_opt / r["step_s"],
            "phases_s": ph,
        }
    return out


def _print_link(label: str, rows: dict[str, Any], fits: dict[str, Any]) -> None:
    print(f"\n== link {label} ==")
    for kind, f in fits.items():
        print(f"  fit {kind:15s}: alpha {f.alpha_s * 1e3:8.3f} ms, "
              f"bandwidth {f.bandwidth_bytes_per_s / 1e6:9.2f} MB/s, r2 {f.r2:.4f}, "
              f"max rel err {f.max_rel_err:.2f}")
    print(f"  {'method':8s} {'measured ms':>12s} {'compute ms':>11s} {'pred comm ms':>13s} "
          f"{'ideal ms':>9s} {'meas speedup':>13s} {'ideal speedup':>14s} {'frac':>6s}")
    for m, r in rows.items():
        print(f"  {m:8s} {r['measured_step_s'] * 1e3:12.1f} {r['compute_step_s'] * 1e3:11.1f} "
              f"{(r['pred_blocking_comm_s'] + r['pred_async_comm_s']) * 1e3:13.1f} "
              f"{r['ideal_step_s'] * 1e3:9.1f} "
              f"{r.get('measured_speedup', 1.0):13.2f} {r.get('ideal_speedup', 1.0):14.2f} "
              f"{r.get('fraction_of_ideal', 1.0):6.2f}")


def analyse_all(results: dict, fit_min_bytes: int) -> None:
    """(Re)compute every link's fits, ideal/measured table and mask overhead from the raw sweep
    and run data kept in ``results``, then the summary (in place)."""
    for label, link in results["links"].items():
        res = {"sweep": link["sweep_times_s"], "sweep_sizes": link["sweep_sizes"],
               "runs": link["raw_runs"], "world": results["args"]["world"]}
        fits = _sweep_fits(res["sweep"], res["sweep_sizes"], fit_min_bytes)
        rows = analyse_link(res, fits)
        link.update({
            "fits": {k: f.to_dict() for k, f in fits.items()}, "fit_min_bytes": fit_min_bytes,
            "small_message_latency_s": _small_message_latency(res["sweep"], res["sweep_sizes"]),
            "smallest_priced_message_bytes": _smallest_priced(rows),
            "methods": rows, "mask_overhead": mask_overhead(res)})
        _print_link(label, rows, fits)
    results["summary"] = summarize(results)


def _plan(args: argparse.Namespace, links: list[float | None]
          ) -> list[tuple[float | None, str, argparse.Namespace]]:
    """(rate, role, arguments) of every launch: the fit links, the held-out rates, then the
    held-out model size on its link (``--holdout-d-model`` at ``--holdout-model-rate``)."""
    plan: list[tuple[float | None, str, argparse.Namespace]] = [(r, "fit", args) for r in links]
    plan += [(float(r), "held-out", args) for r in args.holdout_rates.split(",") if r]
    if args.holdout_d_model:
        other = argparse.Namespace(**{**vars(args), "d_model": args.holdout_d_model})
        rate = float(args.holdout_model_rate) if args.holdout_model_rate else None
        plan.append((rate, "held-out", other))
    return plan


#: ``--calibrate``: the step-time model's calibration (docs/steptime.md), ~10 min on 2 cores
CALIBRATE = {"rates": "1000,100,10", "holdout_rates": "300", "holdout_d_model": 192,
             "holdout_model_rate": "100", "d_model": 128, "steps": 5, "rounds": 5,
             "sweep_sizes": "1024,16384,65536,262144,1048576,4194304", "sweep_repeats": 2,
             "json_out": str(REPO / "bench" / "results" / "scape_calibration.json")}


def parent_main(args: argparse.Namespace) -> int:
    from lmrepro.bench.machine import busy_processes, load_average, machine_info
    from lmrepro.bench.netns import ShapedNamespace, missing_requirements, namespace_name

    problems = missing_requirements()
    if problems:
        print("bench_scape_netns: cannot run here:\n  - " + "\n  - ".join(problems),
              file=sys.stderr)
        return 2
    links: list[float | None] = ([None] if not args.no_unlimited else []) + \
        [float(r) for r in args.rates.split(",") if r]
    info = machine_info()
    info["busy_processes_at_start"] = busy_processes()
    load_start = load_average()
    t_begin = time.perf_counter()
    results: dict[str, Any] = {"benchmark": "scape_netns", "machine": info,
                               "args": {k: v for k, v in vars(args).items()
                                        if k not in ("worker", "worker_out")},
                               "links": {}}
    print(f"bench_scape_netns: {info['cpu_model']}, {info['logical_cores']} cores, torch "
          f"{info['torch']}; load {load_start}", flush=True)
    name = namespace_name()
    with tempfile.TemporaryDirectory() as tmp, ShapedNamespace(name) as ns:
        results["namespace"] = {"name": ns.name, "addresses": ns.addresses()}
        print(f"namespace {ns.name}: {ns.addresses()}", flush=True)
        for rate, role, run_args in _plan(args, links):
            label = "unlimited" if rate is None else f"{rate:g}mbit"
            same_rate = results["links"].get(label)
            if run_args.d_model != args.d_model:
                label += f"-d{run_args.d_model}"
            cmd = ns.shape(rate)
            qdisc = ns.qdisc()
            print(f"\n-- link {label} ({role}): {' '.join(cmd) if cmd else 'no qdisc'} | "
                  f"{qdisc}", flush=True)
            t0 = time.perf_counter()
            # a held-out model size on a link already swept reuses that link's sweep
            res = _launch(ns, run_args, Path(tmp) / f"{label}.json",
                          skip_sweep=same_rate is not None)
            if same_rate is not None:
                res["sweep"], res["sweep_sizes"] = (same_rate["sweep_times_s"],
                                                    same_rate["sweep_sizes"])
            fits = _sweep_fits(res["sweep"], res["sweep_sizes"], args.fit_min_bytes)
            res["world"] = args.world
            rows = analyse_link(res, fits)
            _print_link(label, rows, fits)
            results["links"][label] = {
                "rate_mbit": rate, "tc_command": cmd, "qdisc": qdisc, "role": role,
                "model": {"layers": run_args.layers, "d_model": run_args.d_model},
                "sweep_reused": same_rate is not None,
                "wall_s": time.perf_counter() - t0,
                "fits": {k: f.to_dict() for k, f in fits.items()},
                "fit_min_bytes": args.fit_min_bytes,
                "small_message_latency_s": _small_message_latency(res["sweep"],
                                                                  res["sweep_sizes"]),
                "smallest_priced_message_bytes": _smallest_priced(rows),
                "sweep_sizes": res["sweep_sizes"], "sweep_times_s": res["sweep"],
                "methods": rows, "mask_overhead": mask_overhead(res), "raw_runs": res["runs"],
            }
    runs = next(iter(results["links"].values()))["raw_runs"]
    owned = next((r for r in runs if r.get("owned")), None)
    if owned:
        results["mask_selection_alternatives"] = mask_selection_alternatives(
            # keyed by the fraction kept, 1 - sparsity (the selection's own argument)
            owned["owned"], sorted({1.0 - float(r["sparsity"]) for r in runs
                                    if r.get("sparsity")}))
        print("mask selection alternatives (1 thread):",
              json.dumps(results["mask_selection_alternatives"], indent=1), flush=True)
    results["namespace"]["deleted"] = name not in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True).stdout
    results["loadavg_start"] = load_start
    results["loadavg_end"] = load_average()
    results["busy_processes_at_end"] = busy_processes()
    results["wall_s"] = time.perf_counter() - t_begin
    results["summary"] = summarize(results)
    print("\nsummary:", json.dumps(results["summary"], indent=2))
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def mask_selection_alternatives(owned: list[int], densities: list[float], repeats: int = 5
                                ) -> dict[str, Any]:
    """1-thread timings of a SCAPE owner's per-tensor selection over the tensors rank 0 owns,
    as implemented (:func:`lmrepro.optim.comm.topk_indices`: ``numpy.argpartition`` on CPU)
    against ``torch.topk`` + sort (the same sets where scores are distinct), and of the bitmap
    packing as implemented (``numpy.packbits``) against the torch fall-back used off the CPU.
    Evidence for the implementation's choices."""
    import torch

    from lmrepro.bench.timing import summarize as summ
    from lmrepro.bench.timing import time_repeats
    from lmrepro.optim.comm import keep_count, pack_bits, topk_indices

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    scores = [torch.randn(n, generator=gen).abs() for n in owned]
    out: dict[str, Any] = {"owned_tensors": len(owned), "owned_coordinates": sum(owned)}
    for d in densities:
        ks = [keep_count(d, n) for n in owned]

        def ours() -> list[torch.Tensor]:
            return [topk_indices(s, k) for s, k in zip(scores, ks)]

        def torch_topk() -> list[torch.Tensor]:
            return [torch.topk(s, k, sorted=False).indices.sort().values
                    for s, k in zip(scores, ks)]

        same = all(torch.equal(a, b) for a, b in zip(ours(), torch_topk()))
        bits = torch.zeros(sum(owned), dtype=torch.bool)
        bits[torch.cat([i + o for i, o in zip(ours(), _offsets(owned))])] = True

        def torch_pack() -> torch.Tensor:
            n = bits.numel()
            padded = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8)
            padded[:n] = bits.to(torch.uint8)
            weights = 1 << torch.arange(8, dtype=torch.uint8)
            return (padded.view(-1, 8) * weights).sum(1, dtype=torch.uint8)

        out[f"{d:g}"] = {
            "kept": sum(ks),
            "numpy_argpartition_s": summ(time_repeats(ours, repeats))["median_s"],
            "torch_topk_sort_s": summ(time_repeats(torch_topk, repeats))["median_s"],
            "same_indices": same,
            "numpy_packbits_s": summ(time_repeats(lambda: pack_bits(bits),
                                                  repeats))["median_s"],
            "torch_pack_s": summ(time_repeats(torch_pack, repeats))["median_s"],
            "same_bytes": bool(torch.equal(pack_bits(bits), torch_pack())),
        }
    return out


def _offsets(sizes: list[int]) -> list[int]:
    out, off = [], 0
    for n in sizes:
        out.append(off)
        off += n
    return out


def summarize(results: dict) -> dict[str, Any]:
    """The headline checks: fraction of the ideal speedup at 99 % on the slowest link, and the
    mask overhead at 99 % on the unlimited link."""
    s: dict[str, Any] = {}
    shaped = [(v["rate_mbit"], k) for k, v in results["links"].items() if v["rate_mbit"]]
    if shaped:
        rate, label = min(shaped)
        r = results["links"][label]["methods"].get("scape99")
        mo = results["links"][label]["mask_overhead"].get("scape99")
        if r and mo:
            s["scape99_mask_wait_s_slowest_link"] = mo["mask_wait_s"]
            s["scape99_mask_allgather_pred_s_slowest_link"] = r["mask_allgather_pred_s"]
        if r:
            s["slowest_link"] = label
            s["scape99_measured_speedup"] = r["measured_speedup"]
            s["scape99_ideal_speedup"] = r["ideal_speedup"]
            s["scape99_fraction_of_ideal"] = r["fraction_of_ideal"]
            s["target_fraction_of_ideal"] = 0.9
            s["fraction_target_met"] = r["fraction_of_ideal"] >= 0.9
    un = results["links"].get("unlimited")
    if un and "scape99" in un["methods"] and "step_over_adamw" in un["methods"]["scape99"]:
        ratio = un["methods"]["scape99"]["step_over_adamw"]
        s["scape99_step_over_adamw_unlimited"] = ratio
        s["target_step_over_adamw"] = 1.05
        s["step_target_met"] = ratio <= 1.05
    if un and "scape99" in un["mask_overhead"]:
        mo = un["mask_overhead"]["scape99"]
        s["scape99_mask_fraction_unlimited"] = mo["mask_fraction"]
        s["target_mask_fraction"] = 0.05
        s["mask_target_met"] = mo["mask_fraction"] <= 0.05
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,100", help="Mbit/s of the shaped links, comma list")
    ap.add_argument("--no-unlimited", action="store_true", help="skip the unshaped link")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="sequences per worker per step")
    ap.add_argument("--steps", type=int, default=4,
                    help="timed steps per block (one block per mode per round)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds; each runs one block of every method and mode in turn")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (SCAPE: >= 1)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--sweep-sizes", default=",".join(str(4 ** i * 1024) for i in range(0, 8)),
                    help="bytes per rank of the alpha-beta sweep (default 1 KiB .. 16 MiB)")
    ap.add_argument("--sweep-repeats", type=int, default=3)
    ap.add_argument("--fit-min-bytes", type=int, default=65536,
                    help="fit alpha-beta on swept sizes >= this (default 64 KiB)")
    ap.add_argument("--holdout-rates", default="",
                    help="Mbit/s of links measured but not used in the step-time model's fit")
    ap.add_argument("--holdout-d-model", type=int, default=0,
                    help="also measure this model width (held out of the fit)")
    ap.add_argument("--holdout-model-rate", default="100",
                    help="Mbit/s of the held-out model's link ('' = unlimited)")
    ap.add_argument("--calibrate", action="store_true",
                    help="the step-time model's calibration: " + ", ".join(
                        f"--{k.replace('_', '-')} {v}" for k, v in CALIBRATE.items()
                        if k != "json_out") + "; writes bench/results/scape_calibration.json")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per link")
    ap.add_argument("--json-out", default=str(DEFAULT_OUT))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--skip-sweep", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reanalyse", default=None, metavar="JSON",
                    help="recompute the analysis of an earlier result file (no measurement)")
    args = ap.parse_args(argv)
    if args.calibrate:
        for k, v in CALIBRATE.items():
            setattr(args, k, v)
    if args.reanalyse:
        results = json.loads(Path(args.reanalyse).read_text())
        analyse_all(results, args.fit_min_bytes)
        print("\nsummary:", json.dumps(results["summary"], indent=2))
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json_out}")
        return 0
    if args.worker:
        worker_main(args)
        return 0
    try:
        return parent_main(args)
    except KeyboardInterrupt:
        print("interrupted; namespace removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
