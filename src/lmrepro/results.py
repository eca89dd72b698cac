"""The one run record and run-directory layout of every trainer, read by the analysis.

A run directory holds:

* ``metrics.jsonl``: one JSON object per logged training step (``step``, ``loss`` in nats, ``lr``,
  ``step_time_s``, and for distributed optimizers ``bytes_<kind>``: the kinds its wing declares,
  and ``bytes_total``), plus evaluation records with
  ``eval_bpb``; append-only, cut back to the checkpointed step on resume
  (:func:`truncate_metrics`);
* ``eval_losses.json``: ``{"losses": [...], "unit": "nats", "batch_size": B, "context": T}``, the
  final model's mean loss on each fixed evaluation batch (paired across methods); a non-finite
  batch loss (a diverged model) is the string ``"nan"``, ``"inf"`` or ``"-inf"``: JSON has no
  such numbers, and ``float()`` reads them back (the analysis then calls the run diverged);
* ``summary.json``: a :class:`RunSummary` (the same keys for every trainer);
* ``checkpoints/``: ``step_XXXXXXX/rank<r>.pt`` per rank and ``latest.json`` naming the last
  complete one (:func:`save_checkpoint`, :func:`publish_checkpoint`, :func:`load_checkpoint`);
* ``.writer.lock``: the lock of the one process writing it (:func:`lmrepro.runlock.writer_lock`).

Every file is written atomically (:mod:`lmrepro.io`), by one writer per run directory
(:mod:`lmrepro.runlock`). A damaged checkpoint raises :class:`CheckpointError` naming the file
and how to start over (move the run directory aside; nothing here deletes a run).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import (BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError,
                      field_serializer, model_validator)

from lmrepro.config import config_error
from lmrepro.errors import ParameterError, check
from lmrepro.io import (DamagedFileError, atomic_torch_save, atomic_write_json, atomic_write_text,
                        jsonl_text, read_json, read_jsonl, torch_load)
from lmrepro.lifetime import fault_point

log = logging.getLogger(__name__)

SUMMARY = "summary.json"
EVAL_LOSSES = "eval_losses.json"
EVAL_LOSSES_TEST = "eval_losses_test.json"      # the same on the test split, where written
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
TOTAL = "total"          # the byte kind that sums the others (``bytes_total``)


class RunDetails(BaseModel):
    """A run's trainer-specific facts (``RunSummary.details``). Each wing declares a subclass
    with the facts its trainers record, for its methods
    (:attr:`lmrepro.pipeline.registry.Wing.details`); a summary is read into the class of its
    method. The fields here are the ones shared code reads. Facts a class does not declare are
    kept (runs written by older versions), and only the facts a trainer set are written back."""

    model_config = ConfigDict(extra="allow")

    final_test_bpb: float | None = None   # the final model on the test split (where scored)

    def fact(self, name: str) -> Any:
        """The fact ``name``, declared or kept from an older run (None when not recorded): what
        shared code reads of a fact a wing names (a role's, a label's)."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return (self.model_extra or {}).get(name)

    @classmethod
    def of(cls, summary: RunSummary | Mapping[str, Any]) -> Self:
        """``summary``'s details read as this class: a :class:`RunSummary` (whatever class its
        details were read into) or a summary as a mapping (``summary.json`` read as JSON)."""
        d = (summary.details if isinstance(summary, RunSummary)
             else _facts_into_details(dict(summary), set(RunSummary.model_fields)).get("details")
             or {})
        if isinstance(d, cls):
            return d
        return cls.model_validate(d.model_dump(exclude_unset=True)
                                  if isinstance(d, RunDetails) else d)


DETAILS_MODELS: dict[str, type[RunDetails]] = {}   # method -> its details class (the wings')
#: every fact the installed details classes declare: one of them beside the common fields of an
#: older summary is read into its details (summaries once kept some of them there)
DETAIL_FACTS: set[str] = set()


def use_details_models(models: Mapping[str, type[RunDetails]]) -> None:
    """Read the details of each method's runs as its class in ``models`` (the installed wings'
    :attr:`lmrepro.pipeline.registry.Wing.details`; a method not in it: :class:`RunDetails`)."""
    DETAILS_MODELS.clear()
    DETAILS_MODELS.update({str(getattr(m, "value", m)): model for m, model in models.items()})
    DETAIL_FACTS.clear()
    DETAIL_FACTS.update(f for model in models.values() for f in model.model_fields)


def details_model(method: Any) -> type[RunDetails]:
    """The details class of ``method``'s runs (:class:`RunDetails` if none)."""
    return DETAILS_MODELS.get(str(getattr(method, "value", method)), RunDetails)


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
    What is one wing's (the facts its roles and labels read) is in ``details``; a summary
    written when some of those facts stood beside the common fields is read the same.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, use_enum_values=True)

    name: str
    method: str = Field(min_length=1, description="what the run trained with: a method a wing "
                        "declares (e.g. 'scape'; lmrepro.pipeline.registry); the analysis picks "
                        "baselines by its role, never by run name")
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
    checkpoint_time_s: float | None = Field(default=None, ge=0)  # checkpoint writes, apart
    peak_rss_bytes: int = Field(ge=0)
    peak_pss_bytes: int | None = Field(default=None, ge=0)
    peak_uss_bytes: int | None = Field(default=None, ge=0)
    idle_torch_process: dict[str, int] | None = None   # lmrepro.memory.idle_torch_process
    n_params: int = Field(ge=0)
    processes: int = Field(ge=1)
    threads: int = Field(ge=1)
    resumed_from_step: int = 0
    finished_at: str | None = None   # UTC, ISO 8601 to the second (older runs: None)
    # mean over steps, by kind: the kinds the run's wing declares, and TOTAL
    bytes_per_step: dict[str, float] | None = None
    bytes_per_step_after_step0: dict[str, float] | None = None
    details: SerializeAsAny[RunDetails] = Field(default_factory=RunDetails)  # per wing
    config: dict[str, Any] = Field(default_factory=dict)    # the run's full configuration

    @model_validator(mode="before")
    @classmethod
    def _details_of_the_method(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _facts_into_details(data, set(cls.model_fields))
        if isinstance(data.get("details"), dict):
            data = {**data, "details": details_model(data.get("method")).model_validate(
                data["details"])}
        return data

    @field_serializer("details")
    def _facts_set(self, details: RunDetails) -> dict[str, Any]:
        return details.model_dump(mode="json", exclude_unset=True)

    @model_validator(mode="after")
    def _diverged_or_measured(self) -> RunSummary:
        if (self.final_bpb is None) != (self.diverged_at_step is not None):
            raise ValueError("final_bpb must be None exactly when diverged_at_step is set "
                             f"(final_bpb = {self.final_bpb!r}, diverged_at_step = "
                             f"{self.diverged_at_step!r})")
        return self

    def to_json(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def _facts_into_details(data: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """An older summary's facts of the details (:data:`DETAIL_FACTS`) kept beside the common
    fields, moved into its details (a fact recorded as None: not recorded; the details' own
    value wins)."""
    moved = [k for k in data if k not in fields and k in DETAIL_FACTS]
    if not moved:
        return data
    details = data.get("details")
    if isinstance(details, RunDetails):
        details = details.model_dump(exclude_unset=True)
    facts = {k: data[k] for k in moved if data[k] is not None}
    return {**{k: v for k, v in data.items() if k not in moved},
            "details": {**facts, **(details or {})}}


def run_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The ``settings`` part of a run's ``config`` (``{model, settings[, run]}``; RGC runs written
    before that layout kept their configuration flat: the whole)."""
    return config.get("settings", config)


def step_time_std(records: list[dict]) -> float | None:
    """Sample standard deviation of the logged ``step_time_s`` (None with fewer than 2)."""
    times = [float(r["step_time_s"]) for r in records if "step_time_s" in r]
    if len(times) < 2:
        return None
    mean = sum(times) / len(times)
    return math.sqrt(sum((t - mean) ** 2 for t in times) / (len(times) - 1))


def _finite_or_name(x: float) -> float | str:
    x = float(x)
    return x if math.isfinite(x) else repr(x)        # "nan", "inf", "-inf"


def write_eval_losses(run_dir: str | Path, losses: list[float], batch_size: int, context: int,
                      split: str = "val") -> None:
    """The final model's per-batch losses on ``split`` (``val``: :data:`EVAL_LOSSES`, ``test``:
    :data:`EVAL_LOSSES_TEST`)."""
    check(split in ("val", "test"), "split", split, "must be 'val' or 'test'")
    name = EVAL_LOSSES if split == "val" else EVAL_LOSSES_TEST
    atomic_write_json(Path(run_dir) / name, {
        "losses": [_finite_or_name(x) for x in losses], "unit": "nats",
        "batch_size": batch_size, "context": context,
    })


def write_summary(run_dir: str | Path, summary: RunSummary | dict[str, Any]) -> dict[str, Any]:
    """Validate ``summary`` as a :class:`RunSummary` and write it; returns the JSON object.

    An invalid summary (a NaN, a throughput of 0) raises :class:`lmrepro.errors.ConfigError`
    naming the run directory and the field, and nothing is written."""
    path = Path(run_dir) / SUMMARY
    try:
        record = (summary if isinstance(summary, RunSummary)
                  else RunSummary.model_validate(summary)).to_json()
    except ValidationError as err:
        raise config_error(err, "summary", where=f"{path} (not written)") from None
    atomic_write_json(path, record)
    return record


def read_summary(run_dir: str | Path) -> RunSummary:
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        raise FileNotFoundError(f"run directory {run_dir} has no {SUMMARY}: did the run finish?")
    try:
        return RunSummary.model_validate(read_json(path))
    except ValidationError as err:
        raise config_error(err, "summary", where=f"{path} (move {run_dir} aside to run it "
                           "again)") from None


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """``{"summary": dict, "eval_losses": list[float], "metrics": list[dict]}`` of one run."""
    run_dir = Path(run_dir)
    return {
        "summary": read_summary(run_dir).to_json(),
        "eval_losses": [float(x) for x in read_json(run_dir / EVAL_LOSSES)["losses"]],
        "metrics": read_jsonl(run_dir / METRICS),
    }


def truncate_metrics(run_dir: str | Path, step: int) -> list[dict]:
    """Keep only the records of steps before ``step`` (a resume re-logs the rest); returns them.

    A last line cut short (a kill or a full disk during an append) is dropped: it was being
    written after the last checkpoint, so it belongs to a step the resume trains again."""
    path = Path(run_dir) / METRICS
    kept = [r for r in read_jsonl(path, drop_partial_tail=True) if r.get("step", math.inf) < step]
    atomic_write_text(path, jsonl_text(kept, path))
    return kept


def mean_bytes(records: list[dict]) -> dict[str, float] | None:
    """Mean ``bytes_<kind>`` of the metrics records that carry ``bytes_total``, by kind (the
    kinds of the first such record, in its order; None if none)."""
    rows = [r for r in records if f"bytes_{TOTAL}" in r]
    if not rows:
        return None
    kinds = [k.removeprefix("bytes_") for k in rows[0] if k.startswith("bytes_")]
    return {k: float(sum(r[f"bytes_{k}"] for r in rows) / len(rows)) for k in kinds}


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


def save_part(run_dir: str | Path, step: int, part: int, state: dict[str, Any]) -> Path:
    """Write process ``part``'s share of the state after ``step`` beside the checkpoint of that
    step (atomically): a multi-process run whose processes each save their own share, so no
    state travels through one process. The checkpoint (:func:`save_checkpoint`, rank 0) names
    how many parts it has; it is complete once published."""
    path = _step_dir(Path(run_dir), step) / f"part{part}.pt"
    atomic_torch_save({"step": int(step), "part": int(part), **state}, path)
    return path


def load_part(run_dir: str | Path, step: int, part: int) -> dict[str, Any]:
    """Process ``part``'s share saved by :func:`save_part` (a clear error when missing or
    damaged)."""
    return _read_state(_step_dir(Path(run_dir), step) / f"part{part}.pt", run_dir, int(step),
                       "the checkpoint's parts are incomplete", "its checkpoint is of step")


def drop_unpublished(run_dir: str | Path, step: int) -> None:
    """Remove step ``step``'s checkpoint directory unless ``latest.json`` points at it (parts
    written only to hand the final state over)."""
    latest = latest_checkpoint(run_dir)
    d = _step_dir(Path(run_dir), step)
    if latest is None or latest.get("dir") != d.name:
        shutil.rmtree(d, ignore_errors=True)


def publish_checkpoint(run_dir: str | Path, step: int, identity: dict[str, Any],
                       world_size: int = 1) -> None:
    """Point ``latest.json`` at ``step`` (the checkpoint is complete) and drop older ones (a
    newer one being written is kept)."""
    run_dir = Path(run_dir)
    name = _step_dir(run_dir, step).name
    atomic_write_json(run_dir / CHECKPOINTS / LATEST,
                      {"step": int(step), "dir": name, "world_size": int(world_size),
                       "identity": identity})
    fault_point(f"checkpoint-published@{step}")   # test hook: killed right after a checkpoint
    for old in (run_dir / CHECKPOINTS).glob("step_*"):
        # only older ones: a newer step's directory may already hold parts that processes
        # running ahead saved (lmrepro.rgc.async_)
        if old.name < name:
            shutil.rmtree(old, ignore_errors=True)


def checkpoint(run_dir: str | Path, step: int, state: dict[str, Any], identity: dict[str, Any]
               ) -> None:
    """Single-process runs: save and publish in one call."""
    save_checkpoint(run_dir, step, state)
    publish_checkpoint(run_dir, step, identity)


class CheckpointError(ParameterError):
    """A checkpoint that cannot be resumed: the message names the file and how to start over."""

    def __init__(self, path: str | Path, run_dir: str | Path, problem: str) -> None:
        run_dir = Path(run_dir)
        super().__init__("checkpoint", str(path),
                         f"{problem}; to start the run over, move its directory aside "
                         f"(mv {run_dir} {run_dir}.damaged) and run again")


def latest_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """``latest.json`` of a run directory, or None when it has no complete checkpoint."""
    path = Path(run_dir) / CHECKPOINTS / LATEST
    if not path.exists():
        return None
    try:
        latest = read_json(path)
    except (DamagedFileError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(path, run_dir, f"is damaged ({err})") from None
    if not (isinstance(latest, dict) and isinstance(latest.get("step"), int)
            and isinstance(latest.get("dir"), str)):
        raise CheckpointError(path, run_dir, "is damaged (not the record a checkpoint writes)")
    return latest


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
    return _read_state(run_dir / CHECKPOINTS / latest["dir"] / f"rank{rank}.pt", run_dir,
                       int(latest["step"]), "the checkpoint directory is incomplete",
                       "latest.json says")


def _read_state(path: Path, run_dir: str | Path, step: int, when_missing: str,
                step_source: str) -> dict[str, Any]:
    """One saved state of step ``step`` (a rank's or a part's), or a :class:`CheckpointError`
    saying what is wrong with the file: missing (``when_missing`` says why that matters),
    damaged, or of another step (``step_source`` names where ``step`` came from)."""
    if not path.exists():
        raise CheckpointError(path, run_dir, f"is missing ({when_missing})")
    try:
        state = torch_load(path)
    except Exception as err:  # noqa: BLE001 - torch reports damage as OSError or RuntimeError
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(path, run_dir, f"is damaged: torch cannot read it ({reason}; "
                              f"{path.stat().st_size} bytes)") from None
    if not (isinstance(state, dict) and int(state.get("step", -1)) == step):
        raise CheckpointError(path, run_dir, f"records step "
                              f"{state.get('step') if isinstance(state, dict) else None}, "
                              f"{step_source} {step}")
    return state
