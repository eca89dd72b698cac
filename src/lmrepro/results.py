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
  complete one, written and read by the run's checkpoint manager (:mod:`lmrepro.checkpoints`);
* ``.writer.lock``: the lock of the one process writing it (:func:`lmrepro.runlock.writer_lock`).

Every file is written atomically (:mod:`lmrepro.io`), by one writer per run directory
(:mod:`lmrepro.runlock`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import (BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError,
                      field_serializer, model_validator)

from lmrepro.config import config_error
from lmrepro.errors import check
from lmrepro.io import atomic_write_json, atomic_write_text, jsonl_text, read_json, read_jsonl

log = logging.getLogger(__name__)

SUMMARY = "summary.json"
EVAL_LOSSES = "eval_losses.json"
EVAL_LOSSES_TEST = "eval_losses_test.json"      # the same on the test split, where written
METRICS = "metrics.jsonl"
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


#: settings recorded under another name, old -> current: the installed wings'
#: (:attr:`lmrepro.pipeline.registry.Wing.renamed_settings`, :func:`use_renamed_settings`)
RENAMED_SETTINGS: dict[str, str] = {}


def use_renamed_settings(renamed: Mapping[str, str]) -> None:
    """Read each old setting name of ``renamed`` as its current name (:func:`run_settings`)."""
    RENAMED_SETTINGS.clear()
    RENAMED_SETTINGS.update(renamed)


def run_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The ``settings`` part of a run's ``config`` (``{model, settings[, run]}``; a run recorded
    with a flat configuration: the whole), every setting under its current name
    (:data:`RENAMED_SETTINGS`: a record keeps the names of its day)."""
    return {RENAMED_SETTINGS.get(k, k): v for k, v in config.get("settings", config).items()}


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
