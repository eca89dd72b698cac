"""Benchmark (not a test): RGC and global backprop at the paper's model shape, a few steps.

The paper's model (docs/papers.md, "RGC"; the ``paper`` profile of ``params.yaml``): 24 blocks
of width 512 (8 heads, MLP 4x), context 512, byte vocabulary, 4 stages of 6 blocks, batch 32 in
8 micro-batches of 4 sequences (the paper's micro-batching is not in the summary we have: this
is the ``paper`` profile's choice), horizon 1 (``--horizon``). What it measures:

1. **The tensor-byte account** (:mod:`lmrepro.rgc.analysis.byte_account`) of each async worker, the
   parent and backprop, from the configuration.
2. **End to end**, each run a fresh process through :func:`lmrepro.rgc.train` (executors
   unchanged): global backprop at ``--backprop-threads``, async RGC with ``--workers`` workers of
   ``--threads-per-worker`` threads. Step time from the run's own per-step log (the first step,
   a warm-up, left out): median, quartiles, min and max. Memory: the executor's sampled peak
   PSS/RSS, every process's high-water mark (``VmHWM``, their sum an upper bound of the
   simultaneous peak) and the run's cgroup peak where the kernel offers one
   (:class:`lmrepro.memory.RunCgroup`). **Pinning**: backprop's process is bound to the first
   ``--backprop-threads`` cores; async worker w to its own ``threads[w]`` cores (the
   executor sets the thread count but binds nothing: the benchmark binds every thread of each
   worker process from outside, ``sched_setaffinity`` per thread, repeated as threads appear)
   and the parent to the cores left. Only where the threads fit the machine's cores.
3. **Each stage's compute alone** per thread count (``--threads``), one fresh process per
   (threads, stage) bound to that many cores (``--parallel-stages``: the K stages of one
   thread count at once on disjoint cores, as the workers run), holding the stage and the
   decoder as a worker does: the blocks' forward, the readout (local loss, its gradient), the
   backward through the blocks, the AdamW steps, per micro-batch; the saved-tensor bytes of the
   stage (autograd hooks) and the growth of the process's ``VmHWM`` over the step, against the
   account.

Phases run in that order and the JSON is rewritten after each, so a run cut short by
``--deadline-s`` (phases that would start after it are skipped and listed) or a kill keeps
what it measured.

    nice -n 19 python bench/bench_rgc_paper_shape.py   # 2 cores: 5.3 min quiet, 17 loaded
    python bench/bench_rgc_paper_shape.py --workers 4 --threads-per-worker 4,4,3,3 \\
        --backprop-threads 12 --threads 4,3 --parallel-stages   # scripts/rgc-paper-shape.sh

Writes ``bench/results/rgc_paper_shape.json`` (``--json-out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "rgc_paper_shape.json"
MIB = 2**20


def load_corpus() -> tuple[np.ndarray, np.ndarray, str]:
    p = REPO / "data" / "embedded" / "shakespeare.txt"
    if p.is_file():
        data = np.fromfile(p, dtype=np.uint8)
        cut = int(0.95 * len(data))
        return data[:cut], data[cut:], "shakespeare"
    from lmrepro.rgc.core.corpus import synthetic_corpus

    data = synthetic_corpus(400_000)
    return data[:360_000], data[360_000:], "synthetic"


def paper_config(args: argparse.Namespace) -> Any:
    """The ``paper`` profile's ``rgc:`` model at this run's placement, threads and steps."""
    from lmrepro.model import ModelConfig
    from lmrepro.rgc.config import RGCConfig

    cores = os.cpu_count() or 1
    K = 4
    workers = args.workers or max(1, min(K, cores))
    spw = [K // workers] * workers
    tpw = [int(t) for t in args.threads_per_worker.split(",")] if args.threads_per_worker \
        else [max(1, cores // workers)] * workers
    bp = args.backprop_threads or min(cores, sum(tpw))
    f = args.shrink
    model = ModelConfig(n_layers=24 // min(f, 6), d_model=512 // f, n_heads=8,
                        context=512 // f, mlp_ratio=4)
    return RGCConfig(model=model, n_stages=K,
                     batch_size=32, micro_batches=8, lr=0.0006, warmup_steps=1,
                     steps=args.steps, horizon=args.horizon, stages_per_worker=spw,
                     threads=tpw, backprop_threads=bp, cores=None,
                     eval_batches=1, eval_batch_size=4, checkpoint_every=0, eval_every=0,
                     timeout_s=1200.0)


def spread(xs: list[float]) -> dict[str, Any]:
    """Median, quartiles, min and max (None with no values)."""
    if not xs:
        return {"n": 0, "median": None}
    q = np.percentile(xs, [25, 50, 75]).tolist()
    return {"n": len(xs), "median": q[1], "q1": q[0], "q3": q[2], "min": min(xs),
            "max": max(xs), "values": xs}


# ---------------------------------------------------------------------------------------------
# pinning
# ---------------------------------------------------------------------------------------------

def core_sets(threads: list[int], cores: int) -> list[list[int]] | None:
    """Consecutive disjoint cores per entry (None when they do not fit)."""
    if sum(threads) > cores:
        return None
    out, at = [], 0
    for t in threads:
        out.append(list(range(at, at + t)))
        at += t
    return out


def pin_process_threads(pid: int, cpus: list[int]) -> int:
    """Bind every thread of ``pid`` to ``cpus``; how many were (re)bound."""
    n = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                if os.sched_getaffinity(int(tid)) != set(cpus):
                    os.sched_setaffinity(int(tid), cpus)
                    n += 1
    return n


class WorkerPinner(threading.Thread):
    """Binds the async executor's worker w (the fork server's children, in start order: the
    executor starts them one by one) to ``cpu_sets[w]`` and this process to ``parent_cpus``,
    every thread, re-checked every 0.2 s as threads appear. ``report`` says what was bound."""

    def __init__(self, cpu_sets: list[list[int]], parent_cpus: list[int] | None) -> None:
        super().__init__(name="worker-pinner", daemon=True)
        self.cpu_sets, self.parent_cpus = cpu_sets, parent_cpus
        self.stop = threading.Event()
        self.report: dict[str, Any] = {"workers": {}, "parent_cpus": parent_cpus}

    def run(self) -> None:
        import psutil

        from lmrepro.memory import multiprocessing_helper_pids

        while not self.stop.wait(0.2):
            if self.parent_cpus:
                pin_process_threads(os.getpid(), self.parent_cpus)
            fs = [p for p in multiprocessing_helper_pids() if p != os.getpid()]
            kids: list[Any] = []
            for pid in fs:
                with contextlib.suppress(psutil.Error):
                    kids += psutil.Process(pid).children()
            kids = sorted(kids, key=lambda p: (p.create_time(), p.pid))
            if len(kids) < len(self.cpu_sets):
                continue
            for w, (p, cpus) in enumerate(zip(kids, self.cpu_sets)):
                n = pin_process_threads(p.pid, cpus)
                r = self.report["workers"].setdefault(str(w), {"pid": p.pid, "cpus": cpus,
                                                               "rebinds": 0})
                r["rebinds"] += n
                with contextlib.suppress(OSError):
                    r["threads"] = len(os.listdir(f"/proc/{p.pid}/task"))


# ---------------------------------------------------------------------------------------------
# 2. end to end (in a fresh process: --one)
# ---------------------------------------------------------------------------------------------

def run_one(cfg_dict: dict, executor: str, pin: bool) -> dict[str, Any]:
    import warnings

    from lmrepro.memory import MemorySampler, idle_torch_process
    from lmrepro.rgc import RGCConfig, train

    cfg = RGCConfig(**cfg_dict)
    cores = os.cpu_count() or 1
    pinned: dict[str, Any] = {"pinned": False}
    pinner = None
    if pin and executor != "async":
        cpus = list(range(min(cores, cfg.single_process_threads)))
        os.sched_setaffinity(0, cpus)      # before torch starts its threads: they inherit it
        pinned = {"pinned": True, "cpus": cpus}
    elif pin:
        sets = core_sets(list(cfg.worker_threads), cores)
        if sets is None:
            pinned = {"pinned": False, "why": f"{cfg.async_threads} worker threads do not fit "
                      f"{cores} cores"}
        else:
            rest = list(range(cfg.async_threads, cores)) or None
            pinner = WorkerPinner(sets, rest)
            pinner.start()
    tr, va, corpus = load_corpus()
    # the summary's idle torch interpreter (a child this process reaps) is measured before
    # the sampler starts, so its peak is not counted as the run's
    idle_torch_process()
    t0 = time.perf_counter()
    # the tree is listed (new processes found, PSS read) every second, every VmHWM read at
    # every 0.2 s tick
    sampler = MemorySampler(interval_s=0.2, full_interval_s=1.0)
    # a run directory, as every pipeline run has: the async workers then save their final
    # parts there and the parent reads them one at a time (no state through the parent)
    with warnings.catch_warnings(record=True) as w, sampler, \
            tempfile.TemporaryDirectory(prefix="lmrepro-paper-shape-") as run_dir:
        warnings.simplefilter("always")
        r = train(cfg, executor, tr, va, Path(run_dir) / "run", corpus=corpus)
    if pinner is not None:
        pinner.stop.set()
        pinner.join()
        pinned = {"pinned": True, **pinner.report}
    s = {k: v for k, v in r.summary.items() if k != "config"}
    steps = [float(x["step_time_s"]) for x in r.metrics if "step_time_s" in x]
    return {"summary": s, "step_times_s": steps, "step_time": spread(steps[1:]),
            "memory_exact": sampler.exact(), "pinning": pinned,
            "warnings": [str(x.message) for x in w], "wall_s": time.perf_counter() - t0,
            "main_pid": os.getpid()}


def run_isolated(cfg_dict: dict, executor: str, pin: bool) -> dict[str, Any]:
    """:func:`run_one` in a fresh Python process placed in its own memory cgroup where one can
    be made (its peak is read before the cgroup is removed)."""
    from lmrepro.memory import RunCgroup

    with RunCgroup(f"lmrepro-paper-shape-{executor}") as cg:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--one",
                                 json.dumps(cfg_dict), executor, "1" if pin else "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if cg.available:
            cg.add(proc.pid)
        out, err = proc.communicate()
        cgroup = cg.info()
    if proc.returncode != 0:
        raise RuntimeError(f"{executor} run failed:\n{err[-3000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    r["cgroup"] = cgroup
    return r


# ---------------------------------------------------------------------------------------------
# 3. each stage's compute alone (in a fresh process: --stage)
# ---------------------------------------------------------------------------------------------

def stage_compute(cfg_dict: dict, k: int, threads: int, repeats: int, pin: bool,
                  first_cpu: int = 0) -> dict[str, Any]:
    """One micro-batch through stage k at ``threads`` threads, ``repeats`` times after a
    warm-up: seconds of the blocks' forward, the readout, the backward and the AdamW steps;
    the stage's saved-tensor bytes; the growth of this process's VmHWM over the first step."""
    import torch

    from lmrepro.memory import status_memory
    from lmrepro.rgc.analysis import byte_account as ba
    from lmrepro.rgc.core.recipe import build_model, make_adamw
    from lmrepro.rgc.config import RGCConfig
    from lmrepro.rgc.core.stages import (decoder_parameters, readout_backward, run_stage,
                                         stage_backward, stage_bounds, stage_parameters)
    from lmrepro.rgc.executors.worker_stages import own_stages_model

    cores = os.cpu_count() or 1
    if pin and first_cpu + threads <= cores:
        os.sched_setaffinity(0, list(range(first_cpu, first_cpu + threads)))
    torch.set_num_threads(threads)
    cfg = RGCConfig(**cfg_dict)
    # the stage and the decoder, as a worker holds them (the parent builds the whole model)
    model = own_stages_model(cfg, [k], build_model(cfg, 0).state_dict())
    model.train()
    bounds = stage_bounds(cfg.model.n_layers, cfg.n_stages)
    params = stage_parameters(model, bounds, k)
    opt = make_adamw(model, params, cfg)
    opt_dec = make_adamw(model, decoder_parameters(model), cfg)
    tr, _, _ = load_corpus()
    gen = torch.Generator().manual_seed(0)
    b, T = cfg.micro_batch_size, cfg.model.context
    starts = torch.randint(0, len(tr) - T - 1, (b,), generator=gen).tolist()
    x = torch.from_numpy(np.stack([tr[s:s + T] for s in starts]).astype(np.int64))
    y = torch.from_numpy(np.stack([tr[s + 1:s + T + 1] for s in starts]).astype(np.int64))
    act = torch.randn(b, T, cfg.model.d_model, generator=gen)
    all_params = list(model.parameters())
    hwm0 = (status_memory(os.getpid()) or (0, 0))[1]
    times: dict[str, list[float]] = {n: [] for n in ("forward", "readout", "backward",
                                                      "optimizer")}
    saved = 0
    hwm_step = 0
    for rep in range(repeats + 1):
        inp = x if k == 0 else act.clone()
        t0 = time.perf_counter()
        if rep == 0:
            saved, h = ba.measure_saved_bytes(lambda: run_stage(model, bounds, k, inp),
                                              all_params)
        else:
            h = run_stage(model, bounds, k, inp)
        t1 = time.perf_counter()
        _, g = readout_backward(model, h, y, 1.0 / cfg.micro_batches)
        t2 = time.perf_counter()
        stage_backward(k, h, None, params, {k: g})
        t3 = time.perf_counter()
        opt.step()
        opt_dec.step()
        t4 = time.perf_counter()
        if rep == 0:
            hwm_step = (status_memory(os.getpid()) or (0, 0))[1] - hwm0
        opt.zero_grad(set_to_none=True)
        opt_dec.zero_grad(set_to_none=True)
        del h, g
        if rep > 0:
            for n, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times[n].append(v)
    n_own, n_dec = ba.stage_parameters(cfg, k), ba.decoder_parameters(cfg)
    # the activations (and the readout's) are freed before AdamW allocates its moments: the
    # step's peak is the larger of the two phases, with the decoder's gradient in both
    during_backward = ba.stage_saved_bytes(cfg, k) + ba.readout_saved_bytes(cfg) \
        + ba.FLOAT * n_dec
    at_optimizer = 3 * ba.FLOAT * (n_own + n_dec)            # gradients and two moments
    expected_growth = max(during_backward, at_optimizer)
    return {"stage": k, "threads": threads, "pinned_cpus": sorted(os.sched_getaffinity(0)),
            "seconds": {n: spread(v) for n, v in times.items()},
            "saved_bytes_measured": saved, "saved_bytes_account": ba.stage_saved_bytes(cfg, k),
            "hwm_growth_bytes": hwm_step, "hwm_growth_account_bytes": expected_growth,
            "hwm_before_step_bytes": hwm0}


def _isolated(args: list[str]) -> Any:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------

def summarize_run(name: str, r: dict) -> str:
    st, s, ex = r["step_time"], r["summary"], r["memory_exact"]
    cg = r["cgroup"]["peak_bytes"]
    step = (f"step {st['median']:.2f} s [{st['min']:.2f}, {st['max']:.2f}] (n={st['n']})"
            if st["n"] else "step n/a (one step only)")
    return (f"  {name:9s}: {s['tokens_per_s']:7.0f} tokens/s, {step}; PSS "
            f"{s['peak_pss_bytes'] / MIB:6.0f} MiB, sum VmHWM {ex['hwm_sum_bytes'] / MIB:6.0f} "
            f"MiB ({ex['hwm_processes']} processes), cgroup peak "
            f"{'n/a' if cg is None else f'{cg / MIB:.0f} MiB'}")


def main_bench(args: argparse.Namespace) -> int:
    from lmrepro.bench.machine import busy_processes, load_average, machine_info
    from lmrepro.rgc.analysis import byte_account as ba

    t_begin = time.perf_counter()
    cfg = paper_config(args)
    cores = os.cpu_count() or 1
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pin = not args.no_pin
    result: dict[str, Any] = {
        "benchmark": "rgc_paper_shape", "machine": machine_info(), "cores": cores,
        "args": vars(args), "config": cfg.to_dict(), "placement": cfg.placement,
        "threads": list(cfg.worker_threads),
        "backprop_threads": cfg.single_process_threads,
        "choices": {"micro_batching": "batch 32 in 8 micro-batches of 4 sequences (the params "
                    "profile `paper`; the paper's own is not in its summary)",
                    "horizon": cfg.horizon, "checkpoints": "none (checkpoint_every 0)",
                    "evaluation": "1 batch of 4 sequences at the end (not timed)"},
        "loadavg_start": load_average(), "busy_processes_at_start": busy_processes(),
        "skipped": [], "phases_s": {},
    }
    deadline = t_begin + args.deadline_s if args.deadline_s else None

    def save() -> None:
        result["wall_s"] = time.perf_counter() - t_begin
        out.write_text(json.dumps(result, indent=2) + "\n")

    def due(name: str) -> bool:
        if deadline is not None and time.perf_counter() > deadline:
            result["skipped"].append(name)
            print(f"  skipped {name}: past --deadline-s", flush=True)
            return False
        return True

    print(f"bench_rgc_paper_shape: {cores} cores; L={cfg.model.n_layers} d={cfg.model.d_model} "
          f"T={cfg.model.context} K={cfg.n_stages} H={cfg.horizon}, batch {cfg.batch_size} in "
          f"{cfg.micro_batches} micro-batches; async {cfg.placement} x "
          f"{list(cfg.worker_threads)} threads, backprop {cfg.single_process_threads} threads; "
          f"{cfg.steps} steps; pinning {'on' if pin else 'off'}", flush=True)
    # 1. the account
    acc_a, acc_b = ba.async_account(cfg), ba.backprop_account(cfg)
    result["account"] = {"async": acc_a, "backprop": acc_b,
                         "async_minus_backprop": ba.dominant_difference(acc_a, acc_b),
                         "in_step_peak": {"async_workers": [ba.peak_in_step(w["bytes"])
                                                            for w in acc_a["workers"]],
                                          "backprop": ba.peak_in_step(acc_b["bytes"])}}
    print(f"  account (MiB): backprop {acc_b['total'] / MIB:.0f}; async workers "
          + ", ".join(f"{w['total'] / MIB:.0f}" for w in acc_a["workers"])
          + f", parent {acc_a['parent']['total'] / MIB:.0f}; async - backprop by kind: "
          + ", ".join(f"{k} {v / MIB:+.0f}" for k, v in result["account"]["async_minus_backprop"]
                      if v), flush=True)
    save()
    # 2. end to end
    result["runs"] = {}
    for name, executor in (("backprop", "backprop"), ("async", "async")):
        if not due(name):
            continue
        t0 = time.perf_counter()
        r = run_isolated(cfg.to_dict(), executor, pin)
        result["runs"][name] = r
        result["phases_s"][name] = time.perf_counter() - t0
        print(summarize_run(name, r), flush=True)
        save()
    # 3. stage compute alone
    result["stage_compute"] = []
    for t in [int(x) for x in args.threads.split(",")]:
        # --parallel-stages: the K stages at once, each bound to its own t cores (as the
        # async workers run, sharing the memory system), where K x t cores exist
        together = args.parallel_stages and pin and cfg.n_stages * t <= cores
        if together:
            if not due(f"stages at {t} threads"):
                continue
            t0 = time.perf_counter()
            procs = [subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--stage",
                 json.dumps(cfg.to_dict()), str(k), str(t), str(args.stage_repeats), "1",
                 str(k * t)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for k in range(cfg.n_stages)]
            outs = [p.communicate() for p in procs]
            if any(p.returncode for p in procs):
                raise RuntimeError("stage compute failed:\n" + "\n".join(
                    e[-2000:] for (_, e), p in zip(outs, procs) if p.returncode))
            done = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
            result["phases_s"][f"stages-t{t}"] = time.perf_counter() - t0
        for k in range(cfg.n_stages):
            if together:
                r = {**done[k], "concurrent_with_other_stages": True}
            else:
                if not due(f"stage {k} at {t} threads"):
                    continue
                t0 = time.perf_counter()
                r = _isolated(["--stage", json.dumps(cfg.to_dict()), str(k), str(t),
                               str(args.stage_repeats), "1" if pin else "0"])
                result["phases_s"][f"stage{k}-t{t}"] = time.perf_counter() - t0
            result["stage_compute"].append(r)
            sec = r["seconds"]
            print(f"  stage {k} at {t} thread(s): forward {sec['forward']['median']:.2f} s, "
                  f"readout {sec['readout']['median']:.2f}, backward "
                  f"{sec['backward']['median']:.2f}, AdamW {sec['optimizer']['median']:.2f} "
                  f"(per micro-batch, median of {sec['forward']['n']}); saved "
                  f"{r['saved_bytes_measured'] / MIB:.1f} MiB (account "
                  f"{r['saved_bytes_account'] / MIB:.1f}); VmHWM +"
                  f"{r['hwm_growth_bytes'] / MIB:.0f} MiB (account "
                  f"{r['hwm_growth_account_bytes'] / MIB:.0f})", flush=True)
            save()
    result["loadavg_end"] = load_average()
    result["busy_processes_at_end"] = busy_processes()
    save()
    print(f"wrote {out} ({result['wall_s']:.0f} s)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        print(json.dumps(run_one(json.loads(argv[1]), argv[2], argv[3] == "1")))
        return 0
    if argv and argv[0] == "--stage":
        print(json.dumps(stage_compute(json.loads(argv[1]), int(argv[2]), int(argv[3]),
                                       int(argv[4]), argv[5] == "1",
                                       int(argv[6]) if len(argv) > 6 else 0)))
        return 0
    cores = os.cpu_count() or 1
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="training steps per run (the first "
                    "is a warm-up, left out of the step-time spread)")
    ap.add_argument("--threads", default=",".join(str(t) for t in (1, 2, 4, 8) if t <= cores),
                    help="thread counts at which each stage's compute is timed alone")
    ap.add_argument("--workers", type=int, default=None, help="async worker processes "
                    "(default min(4, cores)); the 4 stages are split evenly")
    ap.add_argument("--threads-per-worker", default=None, help="e.g. 4,4,3,3 (default: the "
                    "cores split evenly)")
    ap.add_argument("--backprop-threads", type=int, default=None,
                    help="backprop's threads (default: the async total, at most the cores)")
    ap.add_argument("--horizon", type=int, default=1, help="RGC horizon H (the paper "
                    "profile's: 1)")
    ap.add_argument("--stage-repeats", type=int, default=2, help="timed micro-batches per "
                    "stage and thread count (after one warm-up)")
    ap.add_argument("--deadline-s", type=float, default=None, help="skip the phases that "
                    "would start after this many seconds")
    ap.add_argument("--parallel-stages", action="store_true", help="time the stages of one "
                    "thread count at once, each bound to its own cores (where they fit)")
    ap.add_argument("--no-pin", action="store_true", help="do not bind threads to cores")
    ap.add_argument("--shrink", type=int, default=1, help="divide width, context and depth "
                    "by this (a smoke test of the script only; results are not the paper's)")
    ap.add_argument("--json-out", default=str(DEFAULT_OUT))
    return main_bench(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
