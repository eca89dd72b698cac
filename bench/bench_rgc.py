"""Benchmark (not a test): async RGC against its own ideal, and against global backprop.

1. **Each stage's compute alone** (:class:`lmrepro.rgc.executors.worker_stages.WorkerStages`, the
   executor's own code, one process, the worker's thread count, the stages run one after
   another): per micro-batch the forward up to the activation sent on, the readout (and the
   backward when no gradient comes back), the backward phase (H > 1); per step the AdamW steps.
2. **The consensus all-reduce** of the decoder gradient among W gloo processes on 127.0.0.1.
3. **The ideal** step time of the placement on this machine's cores
   (:func:`lmrepro.rgc.analysis.schedule.ideal_step_time`: bottleneck worker, fill and drain bubble,
   all-reduce, the staleness), hence the ideal tokens/s.
4. **End to end**, each run a fresh process through :func:`lmrepro.rgc.train` (its own tokens/s,
   peak RSS/PSS/USS of the process tree, idle torch process), interleaved over ``--repeats``:
   async RGC at the default profile's placement, with H = 1, 2, K and a stale consensus;
   global backprop with the same core budget; global backprop with the paper's allocation ratio
   scaled to this machine (async 29 threads : backprop 24, so backprop gets 24/29 of the cores
   through a CFS CPU quota (cgroup v1 ``cpu`` controller, needs root); without it the figure is
   interpolated between 1 and 2 threads and says so); backprop at 1 thread as a reference.

Reports measured / ideal per async run (the target: >= 90 %), the async/backprop ratios, and
how much of async's extra memory is torch runtimes
(:func:`lmrepro.rgc.analysis.report.memory_split`). The model is the default profile's ``rgc:``
section (``params.yaml``), with ``--steps`` steps.

    flock /tmp/lmrepro-heavy.lock python bench/bench_rgc.py          # ~6 minutes on 2 cores
    flock /tmp/lmrepro-heavy.lock python bench/bench_rgc.py --design   # ~1 minute

Writes ``bench/results/rgc.json`` (``--design``: ``bench/results/rgc_design.json``, the
measurements behind the executor's design: threads or processes, how activations cross between
processes, what reading PSS costs); ``bench/make_performance_doc.py`` renders them into
docs/performance.md and docs/rgc.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "rgc.json"
PAPER_ASYNC_THREADS, PAPER_BACKPROP_THREADS = 29, 24
TARGET_FRACTION = 0.90
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


def load_corpus() -> tuple[np.ndarray, np.ndarray, str]:
    p = REPO / "data" / "embedded" / "shakespeare.txt"
    if p.is_file():
        data = np.fromfile(p, dtype=np.uint8)
        cut = int(0.95 * len(data))
        return data[:cut], data[cut:], "shakespeare"
    from lmrepro.rgc.core.corpus import synthetic_corpus

    data = synthetic_corpus(400_000)
    return data[:360_000], data[360_000:], "synthetic"


# ---------------------------------------------------------------------------------------------
# 1. each stage's compute alone
# ---------------------------------------------------------------------------------------------

def stage_times(cfg_dict: dict, threads: int, repeats: int) -> dict[str, Any]:
    """Median seconds per stage (per micro-batch: ``pre_send``, ``post_send``, ``backward``; per
    step: ``optimizer``) and of the decoder's AdamW step, at ``threads`` intra-op threads. The
    stages run one after another in this process, messages passed by hand (as in the
    executor, without the queues)."""
    import torch

    from lmrepro.data.batches import sample_batch
    from lmrepro.rgc.executors.worker_stages import WorkerStages
    from lmrepro.rgc.core.recipe import build_model, make_adamw, micro_batches
    from lmrepro.seeds import batches_offset
    from lmrepro.rgc.config import RGCConfig
    from lmrepro.rgc.core.stages import decoder_parameters

    torch.set_num_threads(threads)
    cfg = RGCConfig(**cfg_dict)
    K, M = cfg.n_stages, cfg.micro_batches
    model = build_model(cfg, 0)
    model.train()
    runners = [WorkerStages(model, cfg, [k]) for k in range(K)]
    opts = [make_adamw(model, r.params[k], cfg) for k, r in enumerate(runners)]
    opt_dec = make_adamw(model, decoder_parameters(model), cfg)
    train, _, _ = load_corpus()
    gen = batches_offset(0)
    samples: dict[str, list[list[float]]] = {n: [[] for _ in range(K)]
                                             for n in ("pre_send", "post_send", "backward",
                                                       "optimizer")}
    dec_times: list[float] = []
    for _rep in range(repeats + 1):      # the first is a warm-up
        x, y = sample_batch(train, cfg.batch_size, cfg.model.context, gen)
        per = {n: [0.0] * K for n in ("pre_send", "post_send", "backward")}
        for m, (xm, ym) in enumerate(micro_batches(x, y, M)):
            h = xm
            for k, r in enumerate(runners):
                out: list[torch.Tensor] = []
                stamp: list[float] = []
                t0 = time.perf_counter()
                r.forward(m, h, ym, send=lambda a, out=out, stamp=stamp: (
                    stamp.append(time.perf_counter()), out.append(a.detach().clone())))
                t1 = time.perf_counter()
                per["pre_send"][k] += stamp[0] - t0
                per["post_send"][k] += t1 - stamp[0]
                h = out[0]
        if cfg.horizon > 1:
            for m in range(M):
                down: dict[int, torch.Tensor] = {}
                for k in reversed(range(K)):
                    t0 = time.perf_counter()
                    down = runners[k].backward(m, down)
                    per["backward"][k] += time.perf_counter() - t0
        for r in runners:
            r.finish_step()
        for k in range(K):
            t0 = time.perf_counter()
            opts[k].step()
            samples["optimizer"][k].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        opt_dec.step()
        dec_times.append(time.perf_counter() - t0)
        for o in [*opts, opt_dec]:
            o.zero_grad(set_to_none=True)
        for n, v in per.items():
            for k in range(K):
                samples[n][k].append(v[k] / M)
    med = {n: [statistics.median(v[k][1:]) for k in range(K)] for n, v in samples.items()}
    return {"threads": threads, "per_stage": med,
            "decoder_optimizer": statistics.median(dec_times[1:]), "repeats": repeats}


# ---------------------------------------------------------------------------------------------
# 2. the all-reduce
# ---------------------------------------------------------------------------------------------

def _allreduce_rank(rank: int, world: int, port: int, numel: int, n: int, out: Any) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    flat = torch.randn(numel)
    times = []
    for _ in range(n + 3):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    out[rank] = statistics.median(times[3:])


def allreduce_time(world: int, numel: int, n: int = 50) -> float:
    """Median seconds of one gloo all-reduce of ``numel`` floats among ``world`` processes (the
    slowest rank's median)."""
    if world == 1:
        return 0.0
    import torch.multiprocessing as mp

    from lmrepro.distributed import free_port

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=_allreduce_rank, args=(r, world, port, numel, n, out))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        return float(max(out.values()))


# ---------------------------------------------------------------------------------------------
# 3. the ideal
# ---------------------------------------------------------------------------------------------

def worker_times(cfg_dict: dict, measured: dict[int, dict]) -> list[Any]:
    """:class:`WorkerTimes` of each worker of the placement, from the stages' times measured at
    that worker's thread count (``measured``: threads -> :func:`stage_times`)."""
    from lmrepro.rgc.config import RGCConfig
    from lmrepro.rgc.analysis.schedule import WorkerTimes

    cfg = RGCConfig(**cfg_dict)
    out = []
    for stages, threads in zip(cfg.placement, cfg.worker_threads):
        st = measured[threads]["per_stage"]
        out.append(WorkerTimes(
            pre_send=sum(st["pre_send"][k] for k in stages),
            post_send=sum(st["post_send"][k] for k in stages),
            backward=sum(st["backward"][k] for k in stages),
            optimizer=sum(st["optimizer"][k] for k in stages),
            decoder_optimizer=measured[threads]["decoder_optimizer"]))
    return out


def ideal(cfg_dict: dict, measured: dict[int, dict], allreduce_s: float, cores: int
          ) -> dict[str, Any]:
    from lmrepro.rgc.config import RGCConfig
    from lmrepro.rgc.analysis.schedule import busy_step, ideal_step_time

    cfg = RGCConfig(**cfg_dict)
    ws = worker_times(cfg_dict, measured)
    step = ideal_step_time(ws, cfg.micro_batches, cfg.horizon > 1, allreduce_s,
                           cfg.consensus_staleness, cfg.async_threads, cores)
    busy = [busy_step(w, cfg.micro_batches) for w in ws]
    return {"step_s": step, "tokens_per_s": cfg.batch_size * cfg.model.context / step,
            "busy_per_worker_s": busy, "bottleneck_worker": int(np.argmax(busy)),
            "bubble_fraction": 1.0 - max(busy) / step,
            "workers": [w.__dict__ for w in ws], "allreduce_s": allreduce_s}


# ---------------------------------------------------------------------------------------------
# 4. end to end
# ---------------------------------------------------------------------------------------------

def run_one(cfg_dict: dict, executor: str) -> dict[str, Any]:
    import warnings

    from lmrepro.rgc import RGCConfig, train

    tr, va, corpus = load_corpus()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = train(RGCConfig(**cfg_dict), executor, tr, va, corpus=corpus)
    s = {k: v for k, v in r.summary.items() if k != "config"}
    s["warnings"] = [str(x.message) for x in w]
    s["wall_s"] = time.perf_counter() - t0
    return s


@contextlib.contextmanager
def cpu_quota(cores: float) -> Iterator[Path | None]:
    """A cgroup (v1 ``cpu`` controller) whose processes together get ``cores`` CPUs of
    bandwidth (CFS quota per 100 ms period); None where that cannot be made (needs root)."""
    path = CGROUP_CPU / f"lmrepro-bench-{os.getpid()}"
    try:
        path.mkdir()
        period = int((path / "cpu.cfs_period_us").read_text())
        (path / "cpu.cfs_quota_us").write_text(str(int(cores * period)))
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        yield None
        return
    try:
        yield path
    finally:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def run_isolated(cfg_dict: dict, executor: str, cgroup: Path | None = None) -> dict[str, Any]:
    """:func:`run_one` in a fresh Python process (inside ``cgroup`` when given)."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--one",
                             json.dumps(cfg_dict), executor], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{executor} run failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _isolated_json(args: list[str]) -> Any:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median_run(runs: list[dict]) -> dict[str, float]:
    keys = ("tokens_per_s", "mean_step_time_s", "step_time_std_s", "peak_rss_bytes",
            "peak_pss_bytes", "peak_uss_bytes", "final_bpb")
    return {k: float(np.median([r[k] for r in runs if r.get(k) is not None]))
            for k in keys if any(r.get(k) is not None for r in runs)}


def main_bench(args: argparse.Namespace) -> int:
    from lmrepro.bench.machine import busy_processes, load_average, machine_info
    from lmrepro.pipeline.params import load_params
    from lmrepro.pipeline.registry import install
    from lmrepro.rgc.analysis.report import memory_split
    from lmrepro.wings import WINGS

    install(WINGS)
    cores = os.cpu_count() or 1
    base = load_params(REPO / "params.yaml", "default").rgc.config
    K = base.n_stages
    over = dict(steps=args.steps, warmup_steps=min(5, args.steps), eval_batches=4,
                eval_batch_size=8, checkpoint_every=0, eval_every=0)
    if args.n_layers:
        over["model"] = base.model.replace(n_layers=args.n_layers)
    cfg = base.replace(**over)
    info = machine_info()
    info["busy_processes_at_start"] = busy_processes()
    load_start = load_average()
    print(f"bench_rgc: {info['cpu_model']}, {cores} cores, torch {info['torch']}; default "
          f"profile's model L={cfg.model.n_layers} K={K} d={cfg.model.d_model} "
          f"T={cfg.model.context}, batch "
          f"{cfg.batch_size} x {cfg.micro_batches} micro-batches, placement {cfg.placement} x "
          f"{list(cfg.worker_threads)} threads; {args.steps} steps; load {load_start}",
          flush=True)
    t_begin = time.perf_counter()
    variants = {"async": cfg, "async-stale1": cfg.replace(consensus_staleness=1),
                "async-H2": cfg.replace(horizon=2), f"async-H{K}": cfg.replace(horizon=K),
                # running ahead at H = 2 and K (docs/rgc.md): with the others, every (H, s)
                # of the horizon study's frontier (rgc.study.report.frontier_table)
                "async-H2-stale1": cfg.replace(horizon=2, consensus_staleness=1),
                f"async-H{K}-stale1": cfg.replace(horizon=K, consensus_staleness=1)}
    if args.quick:
        variants = {"async": cfg}
    # 1 + 2: stage compute alone, per horizon and thread count; the all-reduce
    stage = {}
    for h in sorted({v.horizon for v in variants.values()}):
        for t in sorted(set(cfg.worker_threads)):
            stage[(h, t)] = _isolated_json(["--stage-times", json.dumps(
                cfg.replace(horizon=h).to_dict()), str(t), str(args.stage_repeats)])
            st = stage[(h, t)]["per_stage"]
            print(f"  stage compute alone, H={h}, {t} thread(s), ms per micro-batch: " + ", ".join(
                f"stage {k}: {1e3 * st['pre_send'][k]:.1f} + {1e3 * st['post_send'][k]:.1f}"
                f" + bwd {1e3 * st['backward'][k]:.1f}" for k in range(K)), flush=True)
    from lmrepro.model import ByteTransformer

    n_dec = sum(p.numel() for p in ByteTransformer(cfg.model).decoder.parameters())
    allreduce_s = _isolated_json(["--allreduce", str(cfg.n_workers), str(n_dec)])
    print(f"  all-reduce of {n_dec} floats among {cfg.n_workers} processes: "
          f"{allreduce_s * 1e3:.3f} ms", flush=True)
    ideals = {name: ideal(v.to_dict(), {t: stage[(v.horizon, t)] for t in v.worker_threads},
                          allreduce_s, cores) for name, v in variants.items()}
    # 4: end to end, interleaved
    bp_same = cfg.replace(backprop_threads=cfg.async_threads)
    bp_one = cfg.replace(backprop_threads=1)
    quota_cores = cfg.async_threads * PAPER_BACKPROP_THREADS / PAPER_ASYNC_THREADS
    # the same-layout control: global backprop on the async placement and threads
    # (lmrepro.rgc.executors.pipelined), so the ratio to async RGC is RGC's decoupling alone
    runs: dict[str, list[dict]] = {n: [] for n in [*variants, "backprop", "backprop-1thread",
                                                   "backprop-paper-ratio",
                                                   "pipelined-backprop"]}
    with cpu_quota(quota_cores) as cg:
        for rep in range(args.repeats):
            order = list(runs)
            for name in order if rep % 2 == 0 else order[::-1]:
                if name in variants:
                    r = run_isolated(variants[name].to_dict(), "async")
                elif name == "backprop":
                    r = run_isolated(bp_same.to_dict(), "backprop")
                elif name == "backprop-1thread":
                    r = run_isolated(bp_one.to_dict(), "backprop")
                elif name == "pipelined-backprop":
                    r = run_isolated(cfg.to_dict(), "pipelined_backprop")
                else:
                    if cg is None:
                        continue
                    r = run_isolated(bp_same.to_dict(), "backprop", cg)
                runs[name].append(r)
                print(f"  #{rep + 1} {name:22s}: {r['tokens_per_s']:8.0f} tokens/s, PSS "
                      f"{r['peak_pss_bytes'] / 2**20:6.0f} MiB, RSS "
                      f"{r['peak_rss_bytes'] / 2**20:6.0f} MiB, bpb {r['final_bpb']:.4f}",
                      flush=True)
    med = {n: _median_run(rs) for n, rs in runs.items() if rs}
    if not runs["backprop-paper-ratio"]:
        # no quota: linear interpolation in cores between 1 and async_threads threads
        lo, hi = med["backprop-1thread"]["tokens_per_s"], med["backprop"]["tokens_per_s"]
        frac = (quota_cores - 1) / max(1, cfg.async_threads - 1)
        med["backprop-paper-ratio"] = {"tokens_per_s": lo + frac * (hi - lo), "interpolated": 1}
    rows = {}
    for name, v in variants.items():
        m = med[name]
        rows[name] = {
            "horizon": v.horizon, "consensus_staleness": v.consensus_staleness,
            "measured_tokens_per_s": m["tokens_per_s"],
            "ideal_tokens_per_s": ideals[name]["tokens_per_s"],
            "fraction_of_ideal": m["tokens_per_s"] / ideals[name]["tokens_per_s"],
            "vs_backprop_same_cores": m["tokens_per_s"] / med["backprop"]["tokens_per_s"],
            "vs_backprop_paper_ratio":
                m["tokens_per_s"] / med["backprop-paper-ratio"]["tokens_per_s"],
            "vs_pipelined_backprop":
                m["tokens_per_s"] / med["pipelined-backprop"]["tokens_per_s"]
                if "pipelined-backprop" in med else None,
            "memory_vs_backprop": memory_split(
                {**runs[name][0], **{k: int(m[k]) for k in ("peak_rss_bytes", "peak_pss_bytes",
                                                             "peak_uss_bytes")}},
                {**runs["backprop"][0], **{k: int(med["backprop"][k]) for k in (
                    "peak_rss_bytes", "peak_pss_bytes", "peak_uss_bytes")}}),
        }
        print(f"  => {name}: {m['tokens_per_s']:.0f} tokens/s = "
              f"{100 * rows[name]['fraction_of_ideal']:.1f} % of the ideal "
              f"{ideals[name]['tokens_per_s']:.0f}; x{rows[name]['vs_backprop_same_cores']:.3f}"
              f" backprop at {cfg.async_threads} cores, "
              f"x{rows[name]['vs_backprop_paper_ratio']:.3f} at the paper's ratio; PSS "
              f"x{rows[name]['memory_vs_backprop']['pss_ratio']:.2f} (RSS "
              f"x{rows[name]['memory_vs_backprop']['rss_ratio']:.2f})", flush=True)
    result = {
        "benchmark": "rgc", "machine": info, "cores": cores, "args": vars(args),
        "config": cfg.to_dict(), "placement": cfg.placement,
        "threads": list(cfg.worker_threads),
        "paper_allocation": {"async_threads": PAPER_ASYNC_THREADS,
                             "backprop_threads": PAPER_BACKPROP_THREADS,
                             "backprop_cores_here": quota_cores,
                             "how": "cgroup CFS quota" if runs["backprop-paper-ratio"]
                             else "interpolated between 1 and the async thread count"},
        "stage_times": {f"H{h}-t{t}": v for (h, t), v in stage.items()},
        "allreduce_s": allreduce_s, "decoder_floats": n_dec,
        "ideal": ideals, "runs": runs, "median": med, "rows": rows,
        "target_fraction_of_ideal": TARGET_FRACTION,
        "target_met": rows["async"]["fraction_of_ideal"] >= TARGET_FRACTION,
        "loadavg_start": load_start, "loadavg_end": load_average(),
        "busy_processes_at_end": busy_processes(), "wall_s": time.perf_counter() - t_begin,
    }
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} ({result['wall_s']:.0f} s)")
    return 0


# ---------------------------------------------------------------------------------------------
# the design measurement behind processes (docs/rgc.md)
# ---------------------------------------------------------------------------------------------

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
    """Is ``torch.set_num_threads`` per Python thread, and do two stage workers run in parallel
    as Python threads or as spawned processes?"""
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


def _handover_consumer(q: Any, r: Any, n: int) -> None:
    import torch

    torch.set_num_threads(1)
    r.put("ready")
    t = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        x, y = q.get()
        if isinstance(x, np.ndarray):
            x, y = torch.from_numpy(x), torch.from_numpy(y)
        t += time.perf_counter() - t0
    r.put(t / n)


def queue_handover(shape: tuple[int, ...] = (4, 128, 128), n: int = 300, repeats: int = 3
                   ) -> dict[str, Any]:
    """Seconds per item of an (activation, targets) pair sent through a bounded
    ``torch.multiprocessing`` queue to a forkserver child: as torch tensors (shared memory, one
    segment and file descriptor per tensor) or as numpy copies (pickled by value through the
    pipe, as the executor does). Median over ``repeats`` of the mean over ``n`` items."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    h = torch.randn(*shape)
    y = torch.zeros(shape[0], shape[1], dtype=torch.long)
    out: dict[str, Any] = {"shape": list(shape), "items": n}
    for mode in ("shared_memory_tensors", "numpy_by_value"):
        per_item, get_s = [], []
        for _ in range(repeats):
            q, r = ctx.Queue(maxsize=2), ctx.Queue()
            p = ctx.Process(target=_handover_consumer, args=(q, r, n))
            p.start()
            r.get()
            t0 = time.perf_counter()
            for _ in range(n):
                if mode == "shared_memory_tensors":
                    q.put((h.detach().clone(), y.clone()))
                else:
                    q.put((h.detach().numpy().copy(), y.numpy()))
            get_s.append(r.get())
            per_item.append((time.perf_counter() - t0) / n)
            p.join()
        out[mode] = {"per_item_s": statistics.median(per_item),
                     "consumer_get_s": statistics.median(get_s)}
    return out


def sampling_cost(n: int = 50) -> dict[str, float]:
    """Seconds to read one process's memory: RSS (``/proc/<pid>/statm``) against RSS, PSS and
    USS (``smaps_rollup``), on this process with torch loaded (the memory sampler's two reads)."""
    import psutil
    import torch

    torch.ones(8) @ torch.ones(8)
    me = psutil.Process()
    t0 = time.perf_counter()
    for _ in range(n):
        me.memory_info()
    rss = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        me.memory_full_info()
    return {"rss_read_s": rss, "pss_uss_read_s": (time.perf_counter() - t0) / n,
            "process_rss_bytes": int(me.memory_info().rss)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        print(json.dumps(run_one(json.loads(argv[1]), argv[2])))
        return 0
    if argv and argv[0] == "--stage-times":
        print(json.dumps(stage_times(json.loads(argv[1]), int(argv[2]), int(argv[3]))))
        return 0
    if argv and argv[0] == "--allreduce":
        print(json.dumps(allreduce_time(int(argv[1]), int(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="training steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved runs per variant")
    ap.add_argument("--stage-repeats", type=int, default=8, help="timed steps, stages alone")
    ap.add_argument("--n-layers", type=int, default=None, help="override the model depth")
    ap.add_argument("--quick", action="store_true", help="only the default async variant")
    ap.add_argument("--json-out", default=str(DEFAULT_OUT))
    ap.add_argument("--design", "--threads-vs-processes", dest="threads_vs_processes",
                    action="store_true", help="only the design measurements: threads or "
                    "processes, queue hand-over, memory-sampling cost (rgc_design.json)")
    args = ap.parse_args(argv)
    if args.threads_vs_processes:
        from lmrepro.bench.machine import machine_info

        from lmrepro.bench.machine import load_average

        load_start = load_average()
        res = {"benchmark": "rgc_design", "machine": machine_info(),
               "result": threads_vs_processes(), "queue_handover": queue_handover(),
               "sampling": sampling_cost(), "loadavg_start": load_start,
               "loadavg_end": load_average()}
        print(json.dumps({k: v for k, v in res.items() if k != "machine"}, indent=2))
        out = Path(args.json_out if args.json_out != str(DEFAULT_OUT) else
                   DEFAULT_OUT.with_name("rgc_design.json"))
        out.write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {out}")
        return 0
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
