"""Render ``docs/performance.md`` from the benchmarks' last results (``bench/results/*.json``).

Every number in the page comes from those files; nothing is typed by hand. A missing result file
is named in the page as not yet run.

    python bench/make_performance_doc.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rgc_speedup  # noqa: E402  (bench/, beside this script)
import rgc_delay  # noqa: E402  (bench/, beside this script)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "performance.md"


def _load(name: str) -> dict | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _yes(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _machine(m: dict) -> str:
    return (f"{m['cpu_model']} ({', '.join(m.get('cpu_flags', [])) or 'no SIMD flags read'}), "
            f"{m['logical_cores']} cores, {m['memory_bytes'] / 2**30:.1f} GiB memory, kernel "
            f"{m['kernel']}; Python {m['python']}, torch {m['torch']} "
            f"({m.get('torch_parallel_backend', '?')}), numpy {m['numpy']}; run at "
            f"{m['date_utc']}")


def _load_line(r: dict) -> str:
    busy = r["machine"].get("busy_processes_at_start", []) + r.get("busy_processes_at_end", [])
    other = "none" if not busy else "; ".join(f"pid {b['pid']} {b['cpu_percent']} % "
                                              f"`{b['cmd'][:60]}`" for b in busy)
    return (f"load average (1/5/15 min) at start {r['loadavg_start']}, at end "
            f"{r['loadavg_end']}; other busy processes seen: {other}")


def _spread(run: dict | None) -> str:
    """A step's median over its timed blocks with the interquartile range and the number of
    timed steps, e.g. ``274.0 (272.7-275.5; 5x4 steps)``."""
    if run is None:
        return "-"
    import numpy as np

    blocks = run.get("block_step_s") or [run["step_s"]]
    q1, med, q3 = np.percentile(np.asarray(blocks, dtype=float), [25, 50, 75]) * 1e3
    return (f"{med:.1f} ({q1:.1f}-{q3:.1f}; {len(blocks)}x{run['steps'] // len(blocks)} "
            "steps)")


def _inside_spread(link: dict) -> str:
    """Whether SCAPE 99 %'s and AdamW's interquartile ranges overlap (the verdict is then
    inside the spread)."""
    import numpy as np

    a, b = _run(link, "scape99", "real"), _run(link, "adamw", "real")
    if not a or not b:
        return ""
    qa = np.percentile(a.get("block_step_s") or [a["step_s"]], [25, 75])
    qb = np.percentile(b.get("block_step_s") or [b["step_s"]], [25, 75])
    overlap = qa[0] <= qb[1] and qb[0] <= qa[1]
    return (" (the two interquartile ranges overlap: the ratio is inside the spread)"
            if overlap else " (the interquartile ranges do not overlap)")


def _run(link: dict, method: str, mode: str) -> dict | None:
    return next((x for x in link["raw_runs"] if x["method"] == method and x["mode"] == mode),
                None)


# ---------------------------------------------------------------------------------------------
def section_scape(r: dict | None) -> str:
    if r is None:
        return ("## SCAPE over a shaped link\n\nNot run yet: `sudo python "
                "bench/bench_scape_netns.py` (needs root and iproute2).\n")
    a = r["args"]
    first = next(iter(r["links"].values()))
    n_params = first["raw_runs"][0]["n_params"]
    parts = [
        "## SCAPE over a shaped link (`bench/bench_scape_netns.py`)\n",
        f"Machine: {_machine(r['machine'])}. {_load_line(r)}.\n",
        f"Set-up: {a['world']} gloo workers under `torchrun` inside network namespace "
        f"`{r['namespace']['name']}` (addresses: `{r['namespace']['addresses']}`; deleted "
        f"afterwards: {r['namespace'].get('deleted')}), 1 thread each. Model: ByteTransformer "
        f"{a['layers']} layers, d = {a['d_model']}, context {a['context']}, "
        f"{n_params / 1e6:.2f} M parameters, batch {a['batch']} sequences per worker. "
        f"{a.get('rounds', 1)} blocks of {a['steps']} timed steps per method and mode "
        f"({a.get('rounds', 1) * a['steps']} timed steps) after {a['warmup']} warm-up steps; "
        "block step time = wall time of the block (barrier to barrier, slower rank) / steps; "
        "every step time is the median over the blocks with the interquartile range. "
        "*compute* = the same steps with every collective replaced by a local stand-in of the "
        "same shape. *ideal* = compute + alpha-beta prediction of each blocking collective (each "
        "collective priced by its own fit, i.e. gloo's algorithms as they are) + the part of the "
        "asynchronous mask all-gather not hidden behind forward/backward. *link-limit* = the "
        "same with the bytes a bandwidth-optimal (ring) algorithm puts on the shared link, "
        "priced by the ping-pong fit: the limit of the link itself.\n",
    ]
    for label, link in r["links"].items():
        parts.append(f"### Link: {label}\n")
        parts.append(f"qdisc: `{link['qdisc'] or 'none (unshaped loopback)'}`; tc command: "
                     f"`{' '.join(link['tc_command']) if link['tc_command'] else 'none'}`.\n")
        fit_sizes = [s for s in link["sweep_sizes"] if s >= link["fit_min_bytes"]]
        parts.append(
            "Alpha-beta fits, `t = alpha + bytes / bandwidth` (bytes handed in per rank; relative "
            f"least squares through the per-size medians of {len(fit_sizes)} sizes from "
            f"{min(fit_sizes) / 1024:.0f} KiB to {max(fit_sizes) / 2**20:.0f} MiB; smaller "
            "messages fit in the token bucket's burst and are shown as measured latency; the "
            "smallest message any method sends is "
            f"{link['smallest_priced_message_bytes'] / 1024:.0f} KiB):\n")
        lat = link["small_message_latency_s"]
        parts.append(_table(
            ["collective", "alpha (ms)", "bandwidth (MB/s)", "R²", "max rel. error",
             f"measured {min(link['sweep_sizes'])} B (ms)"],
            [[k, f"{f['alpha_s'] * 1e3:.3f}", f"{f['bandwidth_MB_per_s']:.2f}",
              f"{f['r2']:.4f}", f"{f['max_rel_err']:.2f}", f"{lat[k] * 1e3:.3f}"]
             for k, f in link["fits"].items()]))
        parts.append("")
        rows = []
        for m, x in link["methods"].items():
            rows.append([m, f"{x['bytes_per_step']['total'] / 1e6:.3f}",
                         _spread(_run(link, m, "real")), _spread(_run(link, m, "compute")),
                         f"{(x['pred_blocking_comm_s'] + x['pred_async_comm_s']) * 1e3:.1f}",
                         f"{x['ideal_step_s'] * 1e3:.1f}", f"{x['measured_over_ideal']:.2f}",
                         f"{x.get('measured_speedup', 1.0):.2f}",
                         f"{x.get('ideal_speedup', 1.0):.2f}",
                         f"{x.get('fraction_of_ideal', 1.0):.2f}",
                         f"{x['link_limit_step_s'] * 1e3:.1f}",
                         f"{x.get('link_limit_speedup', 1.0):.2f}"])
        parts.append(_table(["method", "MB/step/rank",
                             "measured ms: median (IQR; blocks x steps)", "compute ms (same)",
                             "pred. comm ms", "ideal ms", "measured/ideal",
                             "speedup vs AdamW", "ideal speedup", "fraction of ideal",
                             "link-limit ms", "link-limit speedup"], rows))
        parts.append("")
    s = r["summary"]
    parts.append("### Targets\n")
    if "scape99_step_over_adamw_unlimited" in s:
        parts.append(
            f"- SCAPE 99 % step over the dense AdamW step on the unlimited link, measured side by "
            f"side in one run: {s['scape99_step_over_adamw_unlimited']:.3f}x (SCAPE 99 % "
            f"{_spread(_run(r['links']['unlimited'], 'scape99', 'real'))} ms against AdamW "
            f"{_spread(_run(r['links']['unlimited'], 'adamw', 'real'))} ms); target <= "
            f"{s['target_step_over_adamw']:.2f}x: {_yes(s['step_target_met'])}"
            f"{_inside_spread(r['links']['unlimited'])}.")
    if "scape99_fraction_of_ideal" in s:
        parts.append(
            f"- SCAPE 99 % on the slowest link ({s['slowest_link']}): measured speedup over "
            f"dense AdamW {s['scape99_measured_speedup']:.2f}x (SCAPE 99 % "
            f"{_spread(_run(r['links'][s['slowest_link']], 'scape99', 'real'))} ms, AdamW "
            f"{_spread(_run(r['links'][s['slowest_link']], 'adamw', 'real'))} ms), ideal "
            f"{s['scape99_ideal_speedup']:.2f}x, i.e. {100 * s['scape99_fraction_of_ideal']:.0f}"
            f" % of the ideal; target >= 90 %: {_yes(s['fraction_target_met'])}.")
    if "scape99_mask_wait_s_slowest_link" in s:
        parts.append(
            f"- Overlap of the mask all-gather on the slowest link: a step waited "
            f"{s['scape99_mask_wait_s_slowest_link'] * 1e3:.2f} ms for it, while the all-gather "
            f"alone takes {s['scape99_mask_allgather_pred_s_slowest_link'] * 1e3:.2f} ms there "
            "(alpha-beta fit): the rest was hidden behind the next forward/backward.")
    if "scape99_mask_fraction_unlimited" in s:
        parts.append(
            f"- SCAPE's mask work (top-k + encoding + decoding) at 99 % on the unlimited link: "
            f"{100 * s['scape99_mask_fraction_unlimited']:.2f} % of the step; target <= 5 %: "
            f"{_yes(s['mask_target_met'])}.")
    for label, link in r["links"].items():
        mo = link["mask_overhead"]
        if not mo:
            continue
        rows = []
        for m, x in mo.items():
            ph = x["mask_phases_s"]
            rows.append([m, f"{x['step_s'] * 1e3:.1f}"] +
                        [f"{ph[k] * 1e3:.2f}" for k in ("mask_topk", "mask_encode",
                                                        "mask_decode")] +
                        [f"{100 * x['mask_fraction']:.2f} %",
                         f"{x['mask_wait_s'] * 1e3:.2f}",
                         f"{link['methods'][m]['mask_allgather_pred_s'] * 1e3:.2f}",
                         f"{x['payload_wait_s'] * 1e3:.2f}",
                         f"{x['optimizer_local_s'] * 1e3:.1f}",
                         f"{100 * x['optimizer_local_fraction']:.1f} %"])
        parts.append(f"\nSCAPE's optimizer phases per step, link {label}:\n")
        parts.append(_table(["method", "step ms", "owner top-k ms", "encode ms", "decode ms",
                             "mask share", "mask wait ms", "mask all-gather on the link ms",
                             "payload wait ms", "all local optimizer work ms", "its share"],
                            rows))
    parts.append("\n(Timed from outside by wrapping the optimizer instance's methods and its "
                 "collectives' work handles. *Mask wait* = time `step()` blocked on the "
                 "asynchronous mask all-gather started one step earlier; *payload wait* = time "
                 "blocked on the one all-reduce after the owner's top-k ran beside it. *All "
                 "local optimizer work* = `opt.step()` minus time inside collectives and "
                 "waits.)")
    alt = r.get("mask_selection_alternatives")
    if alt:
        parts.append(f"\nThe implementation's choices, measured on the {alt['owned_tensors']} "
                     f"tensors rank 0 owns ({alt['owned_coordinates']} coordinates, 1 thread):\n")
        # the results key each entry by the fraction kept (1 - sparsity); shown as sparsity
        rows = [[f"{round(100 * (1 - float(k)), 6):g} %", x["kept"],
                 f"{x['numpy_argpartition_s'] * 1e3:.2f}",
                 f"{x['torch_topk_sort_s'] * 1e3:.2f}", x["same_indices"],
                 f"{x['numpy_packbits_s'] * 1e3:.2f}", f"{x['torch_pack_s'] * 1e3:.2f}",
                 x["same_bytes"]] for k, x in alt.items() if isinstance(x, dict)]
        parts.append(_table(["sparsity", "kept", "numpy argpartition per tensor (used) ms",
                             "torch.topk + sort ms", "same indices",
                             "numpy packbits (used) ms", "torch packing ms", "same bytes"],
                            rows))
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------
def section_cpu(r: dict | None) -> str:
    if r is None:
        return "## CPU training efficiency\n\nNot run yet: `python bench/bench_cpu.py`.\n"
    th = r["train_threads"]
    m = r["model"]
    parts = [
        "## CPU training efficiency (`bench/bench_cpu.py`)\n",
        f"Machine: {_machine(r['machine'])}. {_load_line(r)}.\n",
        f"Default model: {m['n_layers']} layers, d = {m['d_model']}, {m['n_heads']} heads, "
        f"context {m['context']}, batch {r['batch_size']} ({r['tokens_per_step']} tokens per "
        f"step), `train.threads` = {th}. Training FLOPs per token "
        f"(`lmrepro.model.train_flops_per_token`): {r['flops_per_token_model'] / 1e6:.3f} M "
        f"(torch's FlopCounterMode counts {r['flops_per_token_counted_matmul_only'] / 1e6:.3f} M"
        " for the matmuls alone; it does not count CPU attention).\n",
        "### Peak: fp32 matmul microbenchmark\n",
    ]
    rows = []
    for t, p in r["peak"].items():
        for name, x in p["rows"].items():
            rows.append([t, name, f"{x['m']}x{x['k']} @ {x['k']}x{x['n']}",
                         f"{x['gflops']:.1f}",
                         ", ".join(f"{g:.0f}" for g in x.get("gflops_passes", []))])
    parts.append(_table(["threads", "shape", "matmul", "best GFLOP/s", "each pass"], rows))
    parts.append("")
    parts.append(", ".join(
        f"peak at {t} thread(s): {p['peak_gflops']:.1f} GFLOP/s (model shapes, FLOP-weighted: "
        f"{p['model_shapes_gflops_flop_weighted']:.1f})" for t, p in r["peak"].items()) + ".\n")
    parts.append("### Training step variants, measured side by side (interleaved rounds)\n")
    rows = []
    for v in r["variants"]:
        ph = v["phases_ms"]
        rows.append([v["name"], v["threads"], v["optimizer_impl"], v["compile"],
                     v.get("sdpa_backend") or "default",
                     f"{v['step']['median_s'] * 1e3:.1f}", f"{v['tokens_per_s']:.0f}",
                     f"{v['achieved_gflops']:.1f}", f"{100 * v['mfu']:.1f} %",
                     f"{v['speedup_vs_loop']:.2f}",
                     " / ".join(f"{ph[k]:.1f}" for k in ("data", "forward", "backward", "clip",
                                                         "optimizer")),
                     f"{v['warmup_or_compile_s']:.1f}"])
    parts.append(_table(["variant", "threads", "AdamW impl", "compile", "SDPA",
                         "median ms/step",
                         "tokens/s", "GFLOP/s", "MFU (peak at its threads)", "x baseline",
                         "phases ms: data / fwd / bwd / clip / opt", "warm-up/compile s"], rows))
    parts.append("")
    e = r["end_to_end"]
    parts.append("### End to end through `lmrepro.baseline.trainer.train_single`\n")
    rows = [[k, json.dumps(x["settings_override"]), x["steps"], f"{x['tokens_per_s']:.0f}",
             f"{x['achieved_gflops']:.1f}", f"{100 * x['mfu']:.1f} %", f"{x['wall_s']:.1f}"]
            for k, x in e.items() if isinstance(x, dict)]
    parts.append(_table(["run", "settings", "steps", "tokens/s", "GFLOP/s",
                         f"MFU (peak {r['peak_gflops_at_train_threads']:.1f} GFLOP/s)",
                         "wall s"], rows))
    parts.append(f"\nCurrent defaults: `optimizer_impl = {r['defaults']['optimizer_impl']}`, "
                 f"`compile = {r['defaults']['compile']}`; gain over the code before the fix: "
                 f"{e['gain']:.2f}x tokens/s.\n")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------
def section_rgc(r: dict | None) -> str:
    if r is None:
        return ("## RGC: async against its ideal and against backprop\n\nNot run yet: "
                "`flock /tmp/lmrepro-heavy.lock python bench/bench_rgc.py`.\n")
    c, a = r["config"], r["args"]
    m = c["model"]
    pa = r["paper_allocation"]
    parts = [
        "## RGC: async against its ideal and against backprop (`bench/bench_rgc.py`)\n",
        f"Machine: {_machine(r['machine'])}. {_load_line(r)}.\n",
        f"Model: the default profile's `rgc:` section, {m['n_layers']} layers in "
        f"{c['n_stages']} stages, d = {m['d_model']}, context {m['context']}, batch "
        f"{c['batch_size']} in {c['micro_batches']} micro-batches, {c['steps']} steps, "
        f"corpus shakespeare. Async placement: stages {r['placement']} on "
        f"{len(r['placement'])} worker processes with {r['threads']} threads "
        f"({sum(r['threads'])} in all, {r['cores']} cores). Every end-to-end run is "
        f"a fresh process through `lmrepro.rgc.train`, {a['repeats']} interleaved repeats "
        "(medians).\n",
        "### Each stage's compute alone (ms)\n",
        "Measured with the executor's own code (`WorkerStages`), one process, the stages one "
        "after another, medians of " + str(a["stage_repeats"]) + " steps. Per micro-batch: "
        "*blocks forward* (until the activation is sent on), *readout + backward* (the local "
        "loss, its gradient and, when no gradient comes back, the backward through the "
        "blocks), *backward phase* (H > 1: the gradients that came back); per step: AdamW.\n",
    ]
    rows = []
    for key, st in r["stage_times"].items():
        ps = st["per_stage"]
        for k in range(len(ps["pre_send"])):
            rows.append([key, k, f"{ps['pre_send'][k] * 1e3:.2f}",
                         f"{ps['post_send'][k] * 1e3:.2f}", f"{ps['backward'][k] * 1e3:.2f}",
                         f"{ps['optimizer'][k] * 1e3:.2f}"])
    parts.append(_table(["horizon-threads", "stage", "blocks forward", "readout + backward",
                         "backward phase", "AdamW per step"], rows))
    parts.append("\nDecoder AdamW step: "
                 + ", ".join(f"{k}: {v['decoder_optimizer'] * 1e3:.2f} ms"
                             for k, v in r["stage_times"].items())
                 + f". Consensus all-reduce of the decoder gradient ({r['decoder_floats']} "
                 f"floats) among {len(r['placement'])} gloo processes: "
                 f"{r['allreduce_s'] * 1e3:.3f} ms.\n")
    parts.append("### Measured against the ideal, and against backprop\n")
    parts.append("*Ideal*: `lmrepro.rgc.analysis.schedule.ideal_step_time` of the stage times "
                 "above: the workers run in parallel at their measured speed and wait only where "
                 "the schedule makes them (the fill bubble of the first micro-batch, the drain of "
                 "the gradients with H > 1, the per-step all-reduce; with a stale consensus the "
                 "steps overlap). *bubble* = the ideal step's time the slowest worker is idle. "
                 "Backprop *same cores*: "
                 f"{sum(r['threads'])} threads. Backprop *paper ratio*: the paper "
                 f"gives async {pa['async_threads']} threads and backprop "
                 f"{pa['backprop_threads']}; scaled to this machine backprop gets "
                 f"{pa['backprop_cores_here']:.2f} cores ({pa['how']}). Backprop *same "
                 "layout*: global backprop pipelined over the async run's worker processes and "
                 "threads (`pipelined_backprop`, docs/rgc.md \"The same-layout control\"; "
                 "\"-\": not in this benchmark's run).\n")
    rows = []
    for name, x in r["rows"].items():
        m = x["memory_vs_backprop"]
        rows.append([name, x["horizon"], x["consensus_staleness"],
                     f"{x['measured_tokens_per_s']:.0f}", f"{x['ideal_tokens_per_s']:.0f}",
                     f"{100 * x['fraction_of_ideal']:.1f} %",
                     f"{100 * r['ideal'][name]['bubble_fraction']:.1f} %",
                     f"{x['vs_backprop_same_cores']:.3f}", f"{x['vs_backprop_paper_ratio']:.3f}",
                     "-" if x.get("vs_pipelined_backprop") is None
                     else f"{x['vs_pipelined_backprop']:.3f}",
                     f"{m['pss_ratio']:.2f}", f"{m['rss_ratio']:.2f}",
                     f"{m['pss_candidate_bytes'] / 2**20:.0f}",
                     f"{m['runtimes_bytes'] / 2**20:.0f} / {m['data_bytes'] / 2**20:.0f}"])
    parts.append(_table(["async run", "H", "staleness", "tokens/s", "ideal tokens/s",
                         "measured / ideal", "bubble (ideal)", "x backprop same cores",
                         "x backprop paper ratio", "x backprop same layout",
                         "PSS x backprop", "RSS x backprop",
                         "peak PSS MiB", "extra PSS MiB: runtimes / data"], rows))
    rows = []
    for name in ("backprop", "backprop-paper-ratio", "backprop-1thread", "pipelined-backprop"):
        x = r["median"].get(name)
        if x is None:
            continue
        how = "interpolated" if x.get("interpolated") else "measured"
        rows.append([name, f"{x['tokens_per_s']:.0f}", how,
                     f"{x['peak_pss_bytes'] / 2**20:.0f}" if "peak_pss_bytes" in x else "-",
                     f"{x['peak_rss_bytes'] / 2**20:.0f}" if "peak_rss_bytes" in x else "-"])
    parts.append("")
    parts.append(_table(["backprop run", "tokens/s", "how", "peak PSS MiB", "peak RSS MiB"],
                        rows))
    main = r["rows"]["async"]
    parts.append(f"\n- Target: async RGC at >= {100 * r['target_fraction_of_ideal']:.0f} % of "
                 f"its ideal: {100 * main['fraction_of_ideal']:.1f} %, "
                 f"{_yes(r['target_met'])}.")
    parts.append(f"- Paper: 1.382x the throughput of backprop at 29 vs 24 threads on 31 cores "
                 f"(24 layers); peak memory 4.31 vs 1.94 GiB (2.22x). Here: "
                 f"{main['vs_backprop_paper_ratio']:.3f}x at the paper's ratio, "
                 f"{main['vs_backprop_same_cores']:.3f}x at the same cores; peak PSS "
                 f"{main['memory_vs_backprop']['pss_ratio']:.2f}x (RSS "
                 f"{main['memory_vs_backprop']['rss_ratio']:.2f}x). Of the "
                 f"{main['memory_vs_backprop']['extra_pss_bytes'] / 2**20:.0f} MiB of extra "
                 f"PSS, the {main['memory_vs_backprop']['extra_processes']} workers' runtimes "
                 "(measured when they had started, holding no model) are "
                 f"{main['memory_vs_backprop']['runtimes_bytes'] / 2**20:.0f} MiB; the rest, "
                 "the async tree's data over backprop's, is "
                 f"{main['memory_vs_backprop']['data_bytes'] / 2**20:.0f} MiB (a fresh torch "
                 "interpreter's USS is "
                 f"{main['memory_vs_backprop']['idle_torch_uss_bytes'] / 2**20:.0f} MiB; "
                 "workers forked from a server that preloaded torch share most of it).")
    return "\n".join(parts) + "\n"


RGC_DOC = REPO / "docs" / "rgc.md"
RGC_BEGIN = ("<!-- generated by bench/make_performance_doc.py from bench/results/rgc*.json: "
             "begin -->")
RGC_END = "<!-- generated: end -->"


def rgc_doc_block(r: dict | None, tvp: dict | None) -> str:
    """The figures docs/rgc.md shows (its "Measurements" section), from the RGC benchmark's
    JSON files: the same tables as docs/performance.md's RGC section, and the
    threads-vs-processes measurement behind the executor's design."""
    parts = [section_rgc(r).replace("## RGC: async", "### The benchmark: async", 1)
             .replace("\n### ", "\n#### ")]
    if tvp is None:
        parts.append("### Design measurements\n\nNot run yet: `python bench/bench_rgc.py "
                     "--design`.\n")
    else:
        res = tvp["result"]
        procs = res["two_processes_compute_s"]
        parts.append(
            "### Design measurements (`bench/bench_rgc.py --design`)\n\n"
            f"Machine: {_machine(tvp['machine'])}; load average at start "
            f"{tvp['loadavg_start']}, at end {tvp['loadavg_end']}.\n\n"
            "**Threads or processes.** Stage-sized unit: 15 forward+backward passes of a "
            "2-block d=128 model on 8x128 bytes, 1 intra-op thread each.\n")
        parts.append(_table(["setup", "wall s"], [
            ["one worker alone", f"{res['one_worker_s']:.2f}"],
            ["two Python threads, one worker each",
             f"{res['two_python_threads_wall_s']:.2f}"],
            ["two spawned processes, one worker each (compute of each)",
             " / ".join(f"{v:.2f}" for v in procs.values())],
            ["the same, wall time including start-up",
             f"{res['two_processes_wall_incl_startup_s']:.2f}"]]))
        kept = res["main_threads_after_a_thread_set_1"]
        speedup = 2 * res["one_worker_s"] / res["two_python_threads_wall_s"]
        parts.append(f"\nTwo Python threads did the work of two workers {speedup:.2f}x as fast "
                     "as one worker did one's, in wall time (2 = fully parallel). "
                     f"`torch.set_num_threads(1)` called in a Python thread left the main "
                     f"thread with {kept} thread(s) (set to 2 before): the intra-op thread "
                     + ("count is per thread in this build.\n" if kept == 2 else
                        "count is process-global.\n"))
        q = tvp["queue_handover"]
        parts.append(f"**How activations cross.** One (activation {q['shape']}, targets) pair "
                     "per item through a bounded queue to a fork-server child, "
                     f"{q['items']} items:\n")
        parts.append(_table(["hand-over", "ms per item", "consumer get ms"], [
            [k.replace("_", " "), f"{q[k]['per_item_s'] * 1e3:.3f}",
             f"{q[k]['consumer_get_s'] * 1e3:.3f}"]
            for k in ("shared_memory_tensors", "numpy_by_value")]))
        sm = tvp["sampling"]
        parts.append(f"\n**What reading memory costs.** For one process of "
                     f"{sm['process_rss_bytes'] / 2**20:.0f} MiB RSS: RSS alone "
                     f"{sm['rss_read_s'] * 1e3:.3f} ms, RSS + PSS + USS (`smaps_rollup`) "
                     f"{sm['pss_uss_read_s'] * 1e3:.3f} ms per read.\n")
    parts.append(rgc_speedup.section(r, _load("rgc_paper_shape"), _table))
    parts.append(rgc_delay.section(r, _load("rgc_paper_shape"), _table))
    parts.append(section_rgc_cost(_load("rgc_cost")))
    parts.append(section_rgc_paper_shape(_load("rgc_paper_shape"), "rgc_paper_shape.json"))
    if _load("rgc_paper_shape_16core") is not None:
        parts.append(section_rgc_paper_shape(_load("rgc_paper_shape_16core"),
                                             "rgc_paper_shape_16core.json"))
    return "\n".join(parts)


def section_rgc_cost(r: dict | None) -> str:
    """docs/rgc.md: the cost table that sized the training-length study."""
    if r is None:
        return ("### Cost table of the training-length study\n\nNot run yet: "
                "`python bench/bench_rgc_cost.py`.\n")
    rows = [[x["size"], x["executor"] + (f" H = {x['horizon']}" if x.get("horizon", 1) > 1
                                         else ""), f"{x['steps_per_s']:.2f}",
             f"{x['min']:.2f}-{x['max']:.2f}", len(x["repeats"]),
             " + ".join(f"{v:.2f}" for v in x["pair_steps_per_s_each"])] for x in r["rows"]]
    return ("### Cost table of the training-length study (`bench/bench_rgc_cost.py`, "
            "`rgc_cost.json`)\n\n"
            f"One run on 1 intra-op thread, batch {r['batch']}, "
            f"{r['rows'][0]['steps']} steps per repeat (the training clock: start-up and "
            "evaluation excluded); then two such runs started together, as the study runs "
            "them.\n\n" + _table(["size", "executor", "steps/s (median)", "range",
                                   "repeats", "two at once (each)"], rows) + "\n")


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f}"


def _med(sp: dict) -> str:
    if not sp or not sp.get("n"):
        return "n/a"
    if sp["n"] == 1:
        return f"{sp['median']:.2f}"
    return f"{sp['median']:.2f} [{sp['min']:.2f}, {sp['max']:.2f}]"


def section_rgc_paper_shape(r: dict | None, name: str) -> str:
    """docs/rgc.md, "Memory at the paper's shape": the byte account, the runs' step times and
    exact peaks, each stage's compute alone, from ``bench/bench_rgc_paper_shape.py``'s JSON."""
    if r is None:
        return (f"### At the paper's shape (`{name}`)\n\nNot run yet: `python "
                "bench/bench_rgc_paper_shape.py`.\n")
    c = r["config"]
    m = c["model"]
    acc = r["account"]
    kinds = [k for k in ("parameters", "gradients", "optimizer_state", "activations_kept",
                         "stashed_weights", "readout_transient", "queued_copies",
                         "decoder_copies", "unused_replica", "snapshot")
             # kinds an account of this version has, and older ones its JSON still holds
             if k in acc["backprop"]["bytes"]]
    busy = "; ".join(f"{p.get('cmd', '?')[:60]} ({p.get('cpu_percent', '?')} %)"
                     for p in r.get("busy_processes_at_start", []))
    out = [f"### At the paper's shape (`bench/bench_rgc_paper_shape.py`, `{name}`)\n",
           f"Machine: {_machine(r['machine'])}; load average at start {r['loadavg_start']}, "
           f"at end {r.get('loadavg_end')}; other busy processes at start: "
           f"{busy or 'none'}"
           f". Benchmark wall time {r.get('wall_s', 0):.0f} s; skipped: "
           f"{', '.join(r.get('skipped', [])) or 'nothing'}.\n",
           f"Model: {m['n_layers']} layers, d = {m['d_model']}, {m['n_heads']} heads, context "
           f"{m['context']}, {c['n_stages']} stages, H = {c['horizon']}; batch "
           f"{c['batch_size']} in {c['micro_batches']} micro-batches; {c['steps']} steps per "
           f"run (the first left out of the step times). Async: stages {r['placement']} on "
           f"workers of {r['threads']} threads; backprop: "
           f"{r['backprop_threads']} threads.\n",
           "**Tensor-byte account** (MiB, `lmrepro.rgc.analysis.byte_account`, from the "
           "configuration; *snapshot* is the end-of-run hand-over, outside the steps):\n"]
    rows = [["backprop", *[_mib(acc["backprop"]["bytes"][k]) for k in kinds],
             _mib(acc["backprop"]["total"])]]
    for w in acc["async"]["workers"]:
        rows.append([f"async worker {w['worker']} {w['stages']}",
                     *[_mib(w["bytes"].get(k, 0)) for k in kinds], _mib(w["total"])])
    pb = acc["async"]["parent"]["bytes"]
    rows.append(["async parent", *[_mib(pb.get(k, 0)) for k in kinds],
                 _mib(acc["async"]["parent"]["total"])])
    out.append(_table(["process", *[k.replace("_", " ") for k in kinds], "total"], rows))
    diff = [(k, v) for k, v in acc["async_minus_backprop"] if v]
    out.append("\nAsync minus backprop, largest first: " + ", ".join(
        f"{k.replace('_', ' ')} {v / 2**20:+.0f} MiB" for k, v in diff) + ".\n")
    runs = r.get("runs", {})
    if runs:
        out.append("**End to end** (step time: median [min, max] of the timed steps, s; "
                   "memory in MiB: the executor's sampled peak PSS, the sum of every process's "
                   "`VmHWM` (an upper bound of the simultaneous peak RSS), the run's cgroup "
                   "peak (page cache included) where the kernel offered one):\n")
        rows = []
        for n, x in runs.items():
            s, ex, cg = x["summary"], x["memory_exact"], x["cgroup"]
            pin = x["pinning"]
            rows.append([n, f"{s['tokens_per_s']:.0f}", _med(x["step_time"]),
                         _mib(s["peak_pss_bytes"]), _mib(s["peak_rss_bytes"]),
                         _mib(ex["hwm_sum_bytes"]), str(ex["hwm_processes"]),
                         _mib(cg["peak_bytes"]) if cg["source"] else "n/a",
                         "yes" if pin.get("pinned") else f"no ({pin.get('why', '')})"])
        out.append(_table(["run", "tokens/s", "step s", "peak PSS", "peak RSS",
                           "sum VmHWM", "processes", "cgroup peak", "pinned"], rows))
        cgs = {x["cgroup"]["source"] or x["cgroup"]["unavailable_because"]
               for x in runs.values()}
        out.append(f"\ncgroup: {'; '.join(str(v) for v in cgs)}.\n")
    st = r.get("stage_compute", [])
    if st:
        out.append("**Each stage's compute alone** (one process per stage and thread count, "
                   "bound to that many cores, the model built as the benchmark builds it; s "
                   "per micro-batch, median [min, max]; saved: the bytes autograd saved in the "
                   "stage's forward against the account; VmHWM: the process's growth over its "
                   "first step against the account's larger phase):\n")
        out.append(_table(["threads", "stage", "forward", "readout", "backward", "AdamW step",
                           "saved MiB (account)", "VmHWM + MiB (account)"],
                          [[x["threads"], x["stage"], _med(x["seconds"]["forward"]),
                            _med(x["seconds"]["readout"]), _med(x["seconds"]["backward"]),
                            _med(x["seconds"]["optimizer"]),
                            f"{_mib(x['saved_bytes_measured'])} "
                            f"({_mib(x['saved_bytes_account'])})",
                            f"{_mib(x['hwm_growth_bytes'])} "
                            f"({_mib(x['hwm_growth_account_bytes'])})"] for x in st]))
    return "\n".join(out) + "\n"


def update_rgc_doc(text: str, block: str) -> str:
    """``text`` (docs/rgc.md) with the part between the markers replaced by ``block``."""
    begin, end = text.find(RGC_BEGIN), text.find(RGC_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{RGC_DOC}: markers {RGC_BEGIN!r} ... {RGC_END!r} not found")
    return text[:begin + len(RGC_BEGIN)] + "\n\n" + block.strip() + "\n\n" + text[end:]


def section_calibration(r: dict | None) -> str:
    """The step-time model's calibration: fitted constants and predicted against measured step
    times (held-out points marked), from ``bench/results/scape_calibration.json``."""
    head = "## Step-time model: calibration and validation (docs/steptime.md)\n\n"
    if r is None:
        return (head + "**Not yet calibrated**: `bench/results/scape_calibration.json` does not "
                "exist. Run `sudo python bench/bench_scape_netns.py --calibrate` (about 10 min "
                "on 2 cores, on a quiet machine), then this script.\n")
    sys.path.insert(0, str(REPO / "src"))
    from lmrepro.scape.steptime.fit import calibrate

    cal = calibrate(r)
    parts = [head, f"Machine: {_machine(r['machine'])}. {_load_line(r)}.\n",
             f"Fitted on links {', '.join(cal['fit_links'])}; held out: "
             f"{', '.join(cal['held_out_links']) or 'none'}. Per collective, "
             + ("`t = alpha + n max(beta_mem, s * 8 / R)` (the overlapped form; "
                if cal["form"] == "overlapped" else "`t = alpha + n (beta_mem + s * 8 / R)` (")
             + "R the link rate in bit/s):\n"]
    parts.append(_table(["collective", "alpha (ms)", "beta_mem (ns/B)", "s (link bytes per byte)",
                         "points", "max rel. error"],
                        [[k, f"{m['alpha_s'] * 1e3:.3f}", f"{m['beta_mem_s_per_byte'] * 1e9:.3f}",
                          f"{m['link_bytes_per_byte']:.3f}", m["n_points"],
                          f"{m['max_rel_err']:.2f}"] for k, m in cal["models"].items()]))
    loc = cal["local"]
    parts.append(f"\nLocal constants (compute-only steps): forward/backward "
                 f"{loc['fwd_bwd_s_per_param'] * 1e9:.2f} ns per parameter; AdamW update "
                 f"{loc['dense_s_per_param'] * 1e9:.3f} ns per parameter; SCAPE extra "
                 f"{loc['scape_extra_s_per_param'] * 1e9:.3f} ns per parameter and "
                 f"{loc['s_per_kept'] * 1e9:.2f} ns per kept element.\n")
    rows = [[x["link"], f"{x['n_params'] / 1e6:.2f} M", x["method"], x["role"],
             f"{x['measured_s'] * 1e3:.1f} ({x['q1_s'] * 1e3:.1f}-{x['q3_s'] * 1e3:.1f}; "
             f"{x['blocks']}x{x['timed_steps'] // max(1, x['blocks'])} steps)",
             f"{x['predicted_s'] * 1e3:.1f}", f"{100 * x['rel_error']:+.1f} %",
             "yes" if x["within_tolerance"] else "**no**"] for x in cal["rows"]]
    parts.append(_table(["link", "model", "method", "role",
                         "measured ms: median (IQR; blocks x steps)", "predicted ms", "error",
                         f"within {100 * cal['tolerance']:.0f} %"], rows))
    err = cal["held_out_max_abs_error"]
    parts.append(f"\nHeld-out points within {100 * cal['tolerance']:.0f} %: "
                 f"{_yes(cal['held_out_pass'])}"
                 + (f" (largest error {100 * err:.1f} %)." if err is not None else ".") + "\n")
    for form, other in cal.get("other_forms", {}).items():
        e2 = other["held_out_max_abs_error"]
        parts.append(f"The {form} form on the same runs: held-out points within "
                     f"{100 * cal['tolerance']:.0f} %: {_yes(other['held_out_pass'])}"
                     + (f" (largest error {100 * e2:.1f} %)" if e2 is not None else "")
                     + "; its fitted s: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                      other["link_bytes_per_byte"].items())
                     + ".\n")
    return "\n".join(parts) + "\n"


def render() -> str:
    head = ("# Performance\n\n"
            "Generated by `bench/make_performance_doc.py` from `bench/results/*.json`, the last "
            "run of each benchmark (commands in `bench/README.md`). Do not edit by hand: rerun "
            "the benchmarks and this script.\n\n")
    return head + "\n".join([section_scape(_load("scape_netns")),
                             section_calibration(_load("scape_calibration")),
                             section_cpu(_load("cpu")),
                             section_rgc(_load("rgc"))])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DOC))
    args = ap.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render())
    print(f"wrote {args.out}")
    if RGC_DOC.exists():
        RGC_DOC.write_text(update_rgc_doc(RGC_DOC.read_text(), rgc_doc_block(
            _load("rgc"), _load("rgc_design"))))
        print(f"updated {RGC_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
