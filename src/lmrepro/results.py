"""The on-disk layout of one training run, shared by every trainer and read by the analysis.

A run directory holds:

* ``metrics.jsonl``: one JSON object per logged training step (``step``, ``loss`` in nats, ``lr``,
  ``step_time_s``, and for distributed optimizers ``bytes_grad_values``, ``bytes_param_values``,
  ``bytes_mask``, ``bytes_total``), plus eval records with ``"eval_bpb"``;
* ``eval_losses.json``: ``{"losses": [...], "unit": "nats", "batch_size": B, "context": T}``, the
  final model's mean loss on each fixed evaluation batch (paired across methods);
* ``summary.json``: scalar facts about the run. Keys every trainer writes: ``name``, ``method``,
  ``corpus``, ``steps``, ``tokens``, ``final_bpb``, ``tokens_per_s``, ``mean_step_time_s``,
  ``peak_rss_bytes``, ``seed``; distributed runs add ``world_size``, ``sparsity`` and
  ``bytes_per_step`` (a dict by kind: ``grad_values``, ``param_values``, ``mask``, ``total``).

All files are written atomically (``metrics.jsonl`` is append-only and truncated on resume to the
checkpointed step).
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

from lmrepro.io import atomic_write_json, read_json, read_jsonl

SUMMARY = "summary.json"
EVAL_LOSSES = "eval_losses.json"
METRICS = "metrics.jsonl"


def peak_rss_bytes() -> int:
    """Peak resident set of this process so far, for ``summary.json``'s ``peak_rss_bytes``
    (``ru_maxrss`` is in KiB on Linux). Multi-process runs add up their processes' figures."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def write_eval_losses(run_dir: str | Path, losses: list[float], batch_size: int, context: int
                      ) -> None:
    atomic_write_json(Path(run_dir) / EVAL_LOSSES, {
        "losses": [float(x) for x in losses], "unit": "nats", "batch_size": batch_size,
        "context": context,
    })


def write_summary(run_dir: str | Path, summary: dict[str, Any]) -> None:
    atomic_write_json(Path(run_dir) / SUMMARY, summary)


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """``{"summary": dict, "eval_losses": list[float], "metrics": list[dict]}`` of one run."""
    run_dir = Path(run_dir)
    if not (run_dir / SUMMARY).exists():
        raise FileNotFoundError(f"run directory {run_dir} has no {SUMMARY}: did the run finish?")
    return {
        "summary": read_json(run_dir / SUMMARY),
        "eval_losses": read_json(run_dir / EVAL_LOSSES)["losses"],
        "metrics": read_jsonl(run_dir / METRICS),
    }
