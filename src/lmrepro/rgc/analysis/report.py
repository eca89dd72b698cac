"""RGC-specific tables of the analysis report (notebook 07's appended cells) and the benchmark.

Everything here reads finished runs' :class:`lmrepro.results.RunSummary` records (as dicts) and
``metrics.jsonl``; nothing is typed in.

* :func:`memory_split`: how much of async RGC's extra memory over backprop is torch runtimes (one
  per extra process, priced by the idle torch process measured on the same machine) and how much
  is the run's own data (activations and their copies in the queues, the decoder replicas, the
  optimizer states);
* :func:`lockstep_table`: per step, the largest difference between the async and sync
  executors' stage losses: zero up to float rounding, because the consensus is applied in
  lockstep (docs/rgc.md, "Why async and sync give the same losses");
* :func:`placement_table`: what each run ran on (workers, stages per worker, threads, cores).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lmrepro.errors import check
from lmrepro.results import read_run, run_settings
from lmrepro.memory_phases import PHASES, TRAINING
from lmrepro.rgc.analysis.byte_account import explain_excess
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.details import RGCDetails

GIB = 2**30


def executor(summary: Mapping[str, Any]) -> str | None:
    """The executor that trained a run (``summary``: its ``summary.json`` as a mapping)."""
    return RGCDetails.of(summary).executor


def memory_split(candidate: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Peak PSS of ``candidate`` (an async run's summary) over ``baseline`` (backprop's), split.

    ``runtimes_bytes``: what the candidate's process tree grew by when its workers had started,
    before any model or data existed in them (``details.worker_runtimes_memory``, PSS, measured
    by the executor): the workers' torch runtimes, forked from a server that preloaded torch.
    ``data_bytes`` = the rest of the extra PSS: the async tree's model replicas, activations and
    their queued copies, optimizer states (and runtime pages copied later on write) minus what
    backprop's process holds besides its runtime (its whole model's activations and optimizer
    state): negative when the async workers' data together is smaller than backprop's.
    ``idle_runtimes_bytes`` = extra processes x the idle torch process's USS, the price of
    fresh interpreters (not forked ones: an upper bound here), for comparison. RSS ratios are
    given beside (RSS counts the shared libraries once per process)."""
    for name, s in (("candidate", candidate), ("baseline", baseline)):
        check(s.get("peak_pss_bytes") is not None and s.get("idle_torch_process") is not None,
              f"{name}.peak_pss_bytes", s.get("peak_pss_bytes"),
              "must be recorded (runs written by this version of lmrepro record PSS and the "
              "idle torch process)")
        check(s["peak_pss_bytes"] > 0, f"{name}.peak_pss_bytes", s["peak_pss_bytes"],
              "must be > 0")
    dc = RGCDetails.of(candidate)
    procs_c = int(dc.memory_processes or 1 + int(candidate.get("processes", 1)))
    procs_b = int(RGCDetails.of(baseline).memory_processes or 1)
    extra = candidate["peak_pss_bytes"] - baseline["peak_pss_bytes"]
    idle = max(0, procs_c - procs_b) * int(candidate["idle_torch_process"]["uss"])
    started = (dc.worker_runtimes_memory or {}).get("pss")
    runtimes = int(started) if started is not None else idle
    return {
        "candidate": candidate.get("name"), "baseline": baseline.get("name"),
        "pss_candidate_bytes": candidate["peak_pss_bytes"],
        "pss_baseline_bytes": baseline["peak_pss_bytes"],
        "pss_ratio": candidate["peak_pss_bytes"] / baseline["peak_pss_bytes"],
        "rss_ratio": candidate["peak_rss_bytes"] / baseline["peak_rss_bytes"],
        "extra_pss_bytes": extra,
        "extra_processes": procs_c - procs_b,
        "idle_torch_uss_bytes": int(candidate["idle_torch_process"]["uss"]),
        "idle_runtimes_bytes": idle,
        "runtimes_measured": started is not None,
        "runtimes_bytes": runtimes, "data_bytes": extra - runtimes,
        "runtimes_share": runtimes / extra if extra > 0 else float("nan"),
    }


def memory_split_table(runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """:func:`memory_split` of every async run against the backprop run of its corpus and seed
    (``runs``: name -> summary)."""
    rows = []
    for name, s in runs.items():
        if executor(s) != "async":
            continue
        base = [b for b in runs.values() if b.get("method") == "backprop"
                and b.get("corpus") == s.get("corpus") and b.get("seed") == s.get("seed")]
        if base:
            split = memory_split(s, base[0])
            rows.append({"run": name, "corpus": s.get("corpus"), "seed": s.get("seed"),
                         "PSS async (GiB)": split["pss_candidate_bytes"] / GIB,
                         "PSS backprop (GiB)": split["pss_baseline_bytes"] / GIB,
                         "PSS ratio": split["pss_ratio"], "RSS ratio": split["rss_ratio"],
                         "extra processes": split["extra_processes"],
                         "runtimes at start (GiB)": split["runtimes_bytes"] / GIB,
                         "idle torch USS x extra processes (GiB)":
                             split["idle_runtimes_bytes"] / GIB,
                         "rest: data over backprop's (GiB)": split["data_bytes"] / GIB,
                         "runtimes share of the extra": split["runtimes_share"]})
    return pd.DataFrame(rows)


MIB = 2**20


def memory_phase_table(runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per run (``runs``: name -> summary) and phase of its memory (``details.memory_phases``,
    :mod:`lmrepro.memory_phases`): peak RSS and PSS (MiB), whether the phase is the run's peak
    (the training phase; the evaluation copy and the hand-over are the other rows) and the root
    of its process tree (a fresh process per run: every root differs)."""
    rows = []
    for name, s in runs.items():
        d = RGCDetails.of(s)
        root = (d.process_tree or {}).get("root_pid")
        for phase in PHASES:
            m = (d.memory_phases or {}).get(phase)
            if m is not None:
                rows.append({"run": name, "executor": executor(s), "phase": phase,
                             "counted in the run's peak": phase == TRAINING,
                             "peak RSS (MiB)": m["rss"] / MIB, "peak PSS (MiB)": m["pss"] / MIB,
                             "process tree root": root,
                             "fresh process": (d.process_tree or {}).get("fresh")})
    return pd.DataFrame(rows)


def excess_table(runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Every async run's peak over the backprop run of its corpus and seed, explained by the
    byte account (:func:`lmrepro.rgc.analysis.byte_account.explain_excess`) on RSS and on PSS: the
    measured excess, the tensors by kind, the workers' runtimes, the unaccounted rest (MiB)."""
    rows = []
    for name, s in runs.items():
        base = [b for b in runs.values() if b.get("method") == "backprop"
                and executor(b) == "backprop" and b.get("corpus") == s.get("corpus")
                and b.get("seed") == s.get("seed")]
        conf = s.get("config") or {}
        # records made before the trainers shared one config layout carry no byte account
        if executor(s) != "async" or not base or s.get("peak_pss_bytes") is None \
                or "settings" not in conf:
            continue
        cfg = RGCConfig(**{**run_settings(conf), "model": conf["model"]})
        rss = explain_excess(cfg, dict(s), dict(base[0]), "rss")
        pss = explain_excess(cfg, dict(s), dict(base[0]), "pss")
        rows += [{"run": name, "what": a["what"], "RSS (MiB)": a["bytes"] / MIB,
                  "PSS (MiB)": b["bytes"] / MIB} for a, b in zip(rss, pss)]
    return pd.DataFrame(rows)


def lockstep_table(async_metrics: Sequence[Mapping[str, Any]],
                   sync_metrics: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per step, the two executors' last-stage losses and the largest absolute difference of
    any stage's loss (nats). Steps present in both only; eval records are skipped."""
    a = {int(r["step"]): r for r in async_metrics if "stage_losses" in r}
    b = {int(r["step"]): r for r in sync_metrics if "stage_losses" in r}
    rows = []
    for step in sorted(set(a) & set(b)):
        diff = max(abs(x - y) for x, y in zip(a[step]["stage_losses"], b[step]["stage_losses"]))
        rows.append({"step": step, "async loss (nats)": a[step]["loss"],
                     "sync loss (nats)": b[step]["loss"], "max |difference| (nats)": diff})
    return pd.DataFrame(rows)


def read_runs(runs_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every finished run under ``runs_dir`` (any depth): ``{relative path: read_run(...)}``."""
    root = Path(runs_dir)
    return {str(p.parent.relative_to(root)): read_run(p.parent)
            for p in sorted(root.rglob("summary.json"))}


def lockstep_check(runs: Mapping[str, Mapping[str, Any]]) -> tuple[pd.DataFrame, str]:
    """Async against sync of the same corpus, seed and settings (``runs``: name ->
    :func:`lmrepro.results.read_run` record): per pair the largest stage-loss difference over all
    steps and the final bits per byte of each, and one sentence saying what that shows."""
    rows = []
    for name, run in runs.items():
        s = run["summary"]
        if executor(s) != "async":
            continue
        twin = [(n, r) for n, r in runs.items() if executor(r["summary"]) == "sync"
                and r["summary"].get("corpus") == s.get("corpus")
                and r["summary"].get("seed") == s.get("seed")]
        if not twin:
            continue
        sync_name, sync = twin[0]
        table = lockstep_table(run["metrics"], sync["metrics"])
        rows.append({"async run": name, "sync run": sync_name, "corpus": s.get("corpus"),
                     "seed": s.get("seed"), "steps compared": len(table),
                     "max |stage loss difference| (nats)":
                         float(table["max |difference| (nats)"].max()) if len(table) else None,
                     "final bpb async": s["final_bpb"],
                     "final bpb sync": sync["summary"]["final_bpb"],
                     "consensus_staleness": RGCDetails.of(s).consensus_staleness})
    df = pd.DataFrame(rows)
    if df.empty:
        return df, "No pair of async and sync runs of the same corpus and seed to compare."
    worst = float(df["max |stage loss difference| (nats)"].max())
    text = (f"Over {int(df['steps compared'].sum())} steps of {len(df)} pair(s), the async and "
            f"sync executors' stage losses differ by at most {worst:.2e} nats: float rounding "
            "(the all-reduce and the per-process thread counts sum in another order). Both "
            "compute the same function of the same batches: every stage sees the same weights "
            "at every step because the decoder's consensus gradient is applied in lockstep, "
            "once per step, in every replica; only the wall-clock schedule differs.")
    return df, text


def runs_table(runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per run (``runs``: name -> summary): executor, corpus, seed, final bits per byte,
    tokens/s, and peak memory of the process tree as RSS, PSS and USS (GiB)."""
    return pd.DataFrame([{
        "run": name, "executor": executor(s), "corpus": s.get("corpus"),
        "seed": s.get("seed"), "final bpb": s["final_bpb"], "tokens/s": s["tokens_per_s"],
        "peak RSS (GiB)": s["peak_rss_bytes"] / GIB,
        "peak PSS (GiB)": (s.get("peak_pss_bytes") or float("nan")) / GIB,
        "peak USS (GiB)": (s.get("peak_uss_bytes") or float("nan")) / GIB,
    } for name, s in runs.items()])


def placement_table(runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per run (``runs``: name -> summary): executor, processes, placement, threads per
    process, total threads, the machine's cores and whether the run was oversubscribed."""
    rows = []
    for name, s in runs.items():
        d = RGCDetails.of(s)
        rows.append({"run": name, "executor": executor(s),
                     "processes": s.get("processes"),
                     "stages per process": d.placement,
                     "threads per process": d.threads_per_process,
                     "threads": s.get("threads"), "machine cores": d.machine_cores,
                     "oversubscribed": d.oversubscribed})
    return pd.DataFrame(rows)
