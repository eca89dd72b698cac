"""Run directories in the documented layout (:mod:`lmrepro.results`) with made-up numbers, for
the analysis, claims and notebook tests: real files, chosen figures; and the last checkpoint of a
trained run, for the trainers' tests."""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.checkpoints import Checkpoints
from lmrepro.io import append_jsonl
from lmrepro.results import mean_bytes, write_eval_losses, write_summary

GIB = 1 << 30
N_EVAL = 60


def base_losses(seed: int = 0, n: int = N_EVAL) -> np.ndarray:
    return np.random.default_rng(100 + seed).uniform(1.2, 1.8, n)


def make_run(root: Path, name: str, method: str, *, corpus: str = "shakespeare",
             losses: Any = None, rel: float = 0.0, noise: float = 0.002, seed: int = 0,
             step_time: float = 1.0, tps: float = 1000.0, peak_gib: float = 1.0,
             bytes_per_step: dict | None = None, metrics_bytes: dict | None = None,
             steps: int = 10, processes: int = 1, threads: int = 1,
             step_spread: float | None = 0.1, **extra: Any) -> Path:
    """Write a valid summary.json (:class:`lmrepro.results.RunSummary`), eval_losses.json and
    metrics.jsonl for one run; ``step_spread`` is the per-step standard deviation as a fraction
    of the step time."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    if losses is None:
        b = base_losses(seed)
        noise_rng = np.random.default_rng([zlib.crc32(name.encode()), seed])
        losses = b * (1.0 + rel + noise_rng.normal(0.0, noise, b.size))
    write_eval_losses(run_dir, list(losses), batch_size=8, context=64)
    # RunSummary refuses non-finite numbers: a diverged eval batch shows in eval_losses.json only
    summary = {"name": name, "method": method, "corpus": corpus, "steps": steps,
               "tokens": steps * 512, "final_bpb": float(np.nanmean(losses)) / math.log(2),
               "tokens_per_s": tps, "mean_step_time_s": step_time,
               "train_time_s": steps * step_time, "peak_rss_bytes": int(peak_gib * GIB),
               "seed": seed, "n_params": 0, "processes": processes, "threads": threads,
               "step_time_std_s": None if step_spread is None else step_spread * step_time,
               **extra}
    records = [{"step": step, "loss": 3.0 - 0.1 * step, "lr": 1e-3, "step_time_s": step_time,
                **{f"bytes_{k}": v * (step + 1) for k, v in (metrics_bytes or {}).items()}}
               for step in range(steps)]
    for rec in records + [{"step": steps, "eval_bpb": 2.5}]:
        append_jsonl(run_dir / "metrics.jsonl", rec)
    # as the trainers summarise them: given, or the mean over the metrics records
    write_summary(run_dir, {**summary, "bytes_per_step": bytes_per_step or mean_bytes(records)})
    return run_dir


def latest_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """``latest.json`` of a run directory (None: no complete checkpoint)."""
    return Checkpoints(Path(run_dir), {}, steps=0).latest()


def load_checkpoint(run_dir: str | Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """Rank 0's state of a run directory's last checkpoint, written by the run ``identity``."""
    return Checkpoints(Path(run_dir), identity, steps=0).load()


def run_first(point: Path) -> None:
    """Turn ``point``'s seed-first folders back into the run-first layout (each run's identity
    once, beside its seeds), as the RGC studies were published."""
    for seed in sorted(d for d in point.iterdir() if d.name.startswith("seed")):
        for run in sorted(seed.iterdir()):
            (point / run.name).mkdir(exist_ok=True)
            (run / "identity.json").replace(point / run.name / "identity.json")
            run.rename(point / run.name / seed.name)
        seed.rmdir()
