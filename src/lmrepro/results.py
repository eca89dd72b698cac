"""The one run record and run-directory layout of every trainer, read by the analysis.

A run directory holds:

* ``metrics.jsonl``: one JSON object per logged training step (``step``, ``loss`` in nats, ``lr``,
  ``step_time_s``, and for distributed optimizers ``bytes_<kind>``), plus evaluation records with
  ``eval_bpb``; append-only, cut back to the checkpointed step on resume
  (:func:`truncate_metrics`);
* ``eval_losses.json``: ``{"losses": [...], "unit": "nats", "batch_size": B, "context": T}``, the
  final model's mean loss on each fixed evaluation batch (paired across methods);
* ``summary.json``: a :class:`RunSummary` (the same keys for every trainer);
* ``checkpoints/``: ``step_XXXXXXX/rank<r>.pt`` per rank and ``latest.json`` naming the last
  complete one (:func:`save_checkpoint`, :func:`publish_checkpoint`, :func:`load_checkpoint`).

Every file is written atomically (:mod:`lmrepro.io`).
"""

from __future__ import annotations

import enum
import json
import math
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lmrepro.errors import ParameterError, check
from lmrepro.io import (atomic_torch_save, atomic_write_json, atomic_write_text, read_json,
                        read_jsonl, torch_load)

SUMMARY = "summary.json"
EVAL_LOSSES = "eval_losses.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
BYTE_KINDS = ("grad_values", "param_values", "mask", "total")


class Method(enum.StrEnum):
    """What a run trained with; the analysis picks baselines by this role, never by run name."""

    BACKPROP = "backprop"      # single-process global backprop with AdamW (baseline, RGC's foil)
    ADAMW = "adamw"            # data-parallel dense AdamW (SCAPE's dense baseline)
    ADAMS = "adams"            # data-parallel dense AdamS
    SCAPE = "scape"            # SCAPE (sparse AdamS, the authors' error-feedback momentum rule)
    SCAPE_STALE_M = "scape_stale_m"   # SCAPE with the stale-|m| mask rule (an ablation)
    TOPK = "topk"              # raw-gradient top-k with error feedback on AdamS (SCAPE's foil)
    TOPK_ADAMW = "topk_adamw"  # the same top-k on AdamW
    RGC = "rgc"                # bounded-horizon local training with readout-gradient consensus


class RunSummary(BaseModel):
    """``summary.json`` of every run, whatever trainer wrote it.

    Throughput is ``tokens / train_time_s`` over the steps this invocation trained (start-up,
    checkpoints and evaluation excluded where the trainer can); a run resumed with nothing left to
    train keeps the figures of the invocation that trained it. ``processes`` and ``threads`` are the
    compute the run used (data-parallel workers or stage processes; their intra-op threads in
    total). Peak memory is that of the run's process tree as RSS, PSS and USS
    (:mod:`lmrepro.memory`), beside the footprint of an idle torch process on the same machine;
    ``step_time_std_s`` is the standard deviation of the logged step times (the spread a timing
    comparison must exceed). Non-finite numbers are refused: a run that produced one is not a
    finished run. A run that diverged (a non-finite loss or gradient) stops there and records
    ``diverged_at_step`` with ``final_bpb = None``: the analysis counts it as not non-inferior.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, use_enum_values=True)

    name: str
    method: Method
    corpus: str
    seed: int
    steps: int = Field(ge=0)
    tokens: int = Field(ge=0)
    final_bpb: float | None        # None when the run diverged (then diverged_at_step is set)
    diverged_at_step: int | None = None   # the step whose loss or gradient was not finite
    tokens_per_s: float = Field(gt=0)
    mean_step_time_s: float = Field(gt=0)
    train_time_s: float = Field(gt=0)
    step_time_std_s: float | None = Field(default=None, ge=0)   # spread of the step times
    peak_rss_bytes: int = Field(ge=0)
    peak_pss_bytes: int | None = Field(default=None, ge=0)
    peak_uss_bytes: int | None = Field(default=None, ge=0)
    idle_torch_process: dict[str, int] | None = None   # lmrepro.memory.idle_torch_process
    n_params: int = Field(ge=0)
    processes: int = Field(ge=1)
    threads: int = Field(ge=1)
    resumed_from_step: int = 0
    executor: str | None = None                       # RGC: async | sync | backprop
    sparsity: float | None = None                     # SCAPE / top-k
    bytes_per_step: dict[str, float] | None = None    # mean over steps, by kind (BYTE_KINDS)
    bytes_per_step_after_step0: dict[str, float] | None = None
    details: dict[str, Any] = Field(default_factory=dict)   # trainer-specific facts
    config: dict[str, Any] = Field(default_factory=dict)    # the run's full configuration

    @model_validator(mode="after")
    def _diverged_or_measured(self) -> RunSummary:
        if (self.final_bpb is None) != (self.diverged_at_step is not None):
            raise ValueError("final_bpb must be None exactly when diverged_at_step is set "
                             f"(final_bpb = {self.final_bpb!r}, diverged_at_step = "
                             f"{self.diverged_at_step!r})")
        return self

    def to_json(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def step_time_std(records: list[dict]) -> float | None:
    """Sample standard deviation of the logged ``step_time_s`` (None with fewer than 2)."""
    times = [float(r["step_time_s"]) for r in records if "step_time_s" in r]
    if len(times) < 2:
        return None
    mean = sum(times) / len(times)
    return math.sqrt(sum((t - mean) ** 2 for t in times) / (len(times) - 1))


def write_eval_losses(run_dir: str | Path, losses: list[float], batch_size: int, context: int
                      ) -> None:
    atomic_write_json(Path(run_dir) / EVAL_LOSSES, {
        "losses": [float(x) for x in losses], "unit": "nats", "batch_size": batch_size,
        "context": context,
    })


def write_summary(run_dir: str | Path, summary: RunSummary | dict[str, Any]) -> dict[str, Any]:
    """Validate ``summary`` as a :class:`RunSummary` and write it; returns the JSON object."""
    record = (summary if isinstance(summary, RunSummary)
              else RunSummary.model_validate(summary)).to_json()
    atomic_write_json(Path(run_dir) / SUMMARY, record)
    return record


def read_summary(run_dir: str | Path) -> RunSummary:
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        raise FileNotFoundError(f"run directory {run_dir} has no {SUMMARY}: did the run finish?")
    return RunSummary.model_validate(read_json(path))


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """``{"summary": dict, "eval_losses": list[float], "metrics": list[dict]}`` of one run."""
    run_dir = Path(run_dir)
    return {
        "summary": read_summary(run_dir).to_json(),
        "eval_losses": read_json(run_dir / EVAL_LOSSES)["losses"],
        "metrics": read_jsonl(run_dir / METRICS),
    }


def truncate_metrics(run_dir: str | Path, step: int) -> list[dict]:
    """Keep only the records of steps before ``step`` (a resume re-logs the rest); returns them."""
    path = Path(run_dir) / METRICS
    kept = [r for r in read_jsonl(path) if r.get("step", math.inf) < step]
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    return kept


def mean_bytes(records: list[dict]) -> dict[str, float] | None:
    """Mean ``bytes_<kind>`` of the metrics records that carry them, by kind (None if none)."""
    rows = [r for r in records if "bytes_total" in r]
    if not rows:
        return None
    return {k: float(sum(r[f"bytes_{k}"] for r in rows) / len(rows)) for k in BYTE_KINDS}


# ------------------------------------------------------------------------------------------------
# checkpoints: one format for every trainer
# ------------------------------------------------------------------------------------------------

def _step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:07d}"


def save_checkpoint(run_dir: str | Path, step: int, state: dict[str, Any], rank: int = 0) -> None:
    """Write this rank's state for ``step`` (atomically). Multi-rank runs call
    :func:`publish_checkpoint` on rank 0 once every rank has saved (after a barrier)."""
    atomic_torch_save({"step": int(step), "rank": int(rank), **state},
                      _step_dir(Path(run_dir), step) / f"rank{rank}.pt")


def publish_checkpoint(run_dir: str | Path, step: int, identity: dict[str, Any],
                       world_size: int = 1) -> None:
    """Point ``latest.json`` at ``step`` (the checkpoint is complete) and drop older ones."""
    run_dir = Path(run_dir)
    name = _step_dir(run_dir, step).name
    atomic_write_json(run_dir / CHECKPOINTS / LATEST,
                      {"step": int(step), "dir": name, "world_size": int(world_size),
                       "identity": identity})
    for old in (run_dir / CHECKPOINTS).glob("step_*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)


def checkpoint(run_dir: str | Path, step: int, state: dict[str, Any], identity: dict[str, Any]
               ) -> None:
    """Single-process runs: save and publish in one call."""
    save_checkpoint(run_dir, step, state)
    publish_checkpoint(run_dir, step, identity)


def latest_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """``latest.json`` of a run directory, or None when it has no complete checkpoint."""
    path = Path(run_dir) / CHECKPOINTS / LATEST
    return read_json(path) if path.exists() else None


def load_checkpoint(run_dir: str | Path, identity: dict[str, Any], rank: int = 0,
                    world_size: int = 1) -> dict[str, Any] | None:
    """This rank's state of the last complete checkpoint, or None if there is none.

    Refuses (naming what differs) a checkpoint written by another configuration or world size:
    resuming it would silently mix two runs."""
    run_dir = Path(run_dir)
    latest = latest_checkpoint(run_dir)
    if latest is None:
        return None
    have = latest.get("identity", {})
    want = json.loads(json.dumps(identity, sort_keys=True, default=str))
    diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if diff:
        raise ParameterError(
            "run directory", str(run_dir),
            f"holds a checkpoint of a different run (differs in {diff}: checkpoint "
            f"{[have.get(k) for k in diff]} vs now {[want.get(k) for k in diff]}); "
            "use a fresh run directory, or move this one aside to start over")
    check(int(latest.get("world_size", 1)) == world_size, "world size", world_size,
          f"must equal the checkpoint's {latest.get('world_size')} to resume {run_dir}")
    path = run_dir / CHECKPOINTS / latest["dir"] / f"rank{rank}.pt"
    if not path.exists():
        raise ParameterError("checkpoint", str(path), "is missing: the checkpoint directory is "
                             "incomplete; delete the run directory to start over")
    state = torch_load(path)
    check(int(state["step"]) == int(latest["step"]), "checkpoint", str(path),
          f"records step {state['step']}, latest.json says {latest['step']}")
    return state


# ------------------------------------------------------------------------------------------------
# a stage's run directories and its DVC products
# ------------------------------------------------------------------------------------------------

def prepare_runs_dir(runs_dir: str | Path, identity: dict[str, Any]) -> Path:
    """Keep ``runs_dir`` (finished runs, checkpoints) only if the same configuration and data made
    it; otherwise move it aside to ``<runs_dir>.stale-<UTC time>`` (never deleted), so a changed
    parameter never reuses stale runs. Call it after every check of the configuration passed.

    ``identity`` (parameters and the prepared data's manifests) is stored as
    ``runs_dir/identity.json``. DVC keeps run directories (``persist: true``) so that an
    interrupted stage resumes; this check is what makes that safe.
    """
    import datetime

    runs_dir = Path(runs_dir)
    marker = runs_dir / "identity.json"
    identity = json.loads(json.dumps(identity, sort_keys=True, default=str))
    if runs_dir.exists() and any(runs_dir.iterdir()) and (
            not marker.exists() or read_json(marker) != identity):
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = runs_dir.with_name(f"{runs_dir.name}.stale-{stamp}")
        runs_dir.rename(aside)
        import logging
        logging.getLogger(__name__).warning(
            "%s was made by another configuration or data: moved aside to %s", runs_dir, aside)
    runs_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(marker, identity)
    return runs_dir


def collect_runs(runs_dir: str | Path) -> dict[str, Path]:
    """Finished run directories under ``runs_dir``: ``{"<corpus>/<run>": path}``, sorted."""
    found = {}
    for summary in sorted(Path(runs_dir).glob(f"*/*/{SUMMARY}")):
        run_dir = summary.parent
        found[f"{run_dir.parent.name}/{run_dir.name}"] = run_dir
    return found


METRIC_KEYS = ("final_bpb", "tokens_per_s", "mean_step_time_s", "peak_rss_bytes", "steps",
               "tokens")


def write_stage_products(stage_dir: str | Path, runs: dict[str, Path]) -> None:
    """DVC metrics (``metrics.json``: scalars per run) and plots (``loss_curve.csv``, and
    ``bytes_per_step.csv`` for runs that communicate)."""
    import csv
    import io

    metrics, losses, comm = {}, io.StringIO(), io.StringIO()
    loss_rows = csv.writer(losses, lineterminator="\n")
    loss_rows.writerow(["run", "step", "loss"])
    comm_rows = csv.writer(comm, lineterminator="\n")
    comm_rows.writerow(["run", "step", "bytes_total"])
    for label, run_dir in sorted(runs.items()):
        run = read_run(run_dir)
        summary = run["summary"]
        metrics[label] = {k: summary[k] for k in METRIC_KEYS}
        if summary.get("bytes_per_step"):
            metrics[label]["bytes_per_step"] = summary["bytes_per_step"]["total"]
        for rec in run["metrics"]:
            if "loss" in rec:
                loss_rows.writerow([label, rec["step"], f"{rec['loss']:.6f}"])
            if "bytes_total" in rec:
                comm_rows.writerow([label, rec["step"], rec["bytes_total"]])
    stage_dir = Path(stage_dir)
    atomic_write_json(stage_dir / "metrics.json", metrics)
    atomic_write_text(stage_dir / "loss_curve.csv", losses.getvalue())
    if any("bytes_per_step" in m for m in metrics.values()):
        atomic_write_text(stage_dir / "bytes_per_step.csv", comm.getvalue())
