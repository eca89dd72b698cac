"""The runs of an analysis: loading a run directory, its role, its configuration and scale.

Every function of the analysis takes ``runs``: a mapping ``run name -> run directory`` (or an
already loaded :class:`Run`) in the layout of :mod:`lmrepro.results`.

Roles. Comparisons and claims need to know what a run is: its role is a pure function of the
summary's ``method`` and, where a wing splits a method's runs, the fact of their details it
splits them by (:func:`run_role`), as the wings declare it (:mod:`lmrepro.pipeline.registry`: the
pipeline names no method and no wing's fact). Baselines are picked by role, never by run name, so
renaming a run changes no table.

Seeds. Runs whose configuration differs only in the seed are replicates of one configuration
(:func:`configuration_key`); beside its role, a run's wing may name one fact of its details as
its setting (:func:`run_setting`).

Timings. Two sessions' timings of a candidate against a baseline are comparable when the
suite is the same in what decides the work of a step (:func:`suite_identity`, keyed by
:func:`suite_key`); the timing history pools such sessions on one machine
(:mod:`lmrepro.pipeline.timing_history`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.errors import check
from lmrepro.io import read_json, read_jsonl
from lmrepro.pipeline import registry
from lmrepro.results import (EVAL_LOSSES, EVAL_LOSSES_TEST, METRICS, SUMMARY, RunDetails,
                             RunSummary, read_summary, run_settings)

GIB = float(1 << 30)


def run_role(method: str, details: RunDetails | None = None, where: str = "") -> str:
    """The role of a run: the role a wing declares for its ``method`` and ``details``
    (:func:`lmrepro.pipeline.registry.role_of`). An unknown method, or a run whose details do
    not say which of its method's roles it is, is refused (``where`` prefixes the names in the
    message, e.g. the summary's path)."""
    return registry.role_of(method, details, where)


# --------------------------------------------------------------------------------------------
# Loading runs
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One finished run: its validated summary, role, per-batch eval losses and metrics."""

    name: str
    path: Path
    summary: RunSummary
    role: str
    eval_losses: tuple[float, ...]
    eval_meta: dict[str, Any]
    metrics: tuple[dict[str, Any], ...] = field(repr=False)
    test_losses: tuple[float, ...] = ()     # the test split's, where the trainer scored it

    @property
    def world_size(self) -> int | None:
        """Data-parallel workers; None for the RGC suite, whose processes are pipeline stages
        compared at the same core budget."""
        return self.summary.processes if registry.is_data_parallel(self.role) else None

    @property
    def configuration(self) -> str:
        """:func:`configuration_key` of this run."""
        return configuration_key(self.summary.config)


def _without_names(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_names(v) for k, v in obj.items() if k not in ("name", "seed")}
    if isinstance(obj, list):
        return [_without_names(v) for v in obj]
    return obj


def configuration_key(config: Mapping[str, Any]) -> str:
    """What makes two runs replicates: their configuration (``RunSummary.config``) without run
    names and seeds, as canonical JSON. Runs of one suite that differ only in the seed share it;
    runs of a learning-rate sweep do not."""
    return json.dumps(_without_names(dict(config)), sort_keys=True, default=str)


#: the model's shape in an RGC summary written before the model had a section of its own
MODEL_KEYS = ("n_layers", "d_model", "n_heads", "context", "mlp_ratio", "dropout",
              "tie_embeddings")
#: what that flat layout did not record because the RGC configuration fixed it
FLAT_MODEL_FIXED = {"dropout": 0.0, "tie_embeddings": False}
#: settings that change what a run learns, or when it stops to evaluate, save or give up, not
#: the work of a training step: left out of a timing identity (:func:`timing_configuration`)
NOT_TIMING = frozenset({
    "name", "seed", "lr", "warmup_steps", "min_lr_ratio", "weight_decay", "beta1", "beta2", "eps",
    "lr_schedule", "decay_fraction", "checkpoint_every", "eval_every", "eval_batch_size",
    "eval_batches", "log_every", "timeout_s"})


def timing_configuration(summary: RunSummary) -> dict[str, Any]:
    """What decides a run's time per step: method, the facts of the details that decide what a
    run is (:func:`lmrepro.pipeline.registry.identity_facts`, None where not recorded),
    processes, threads, steps, the model's shape and every setting but those of
    :data:`NOT_TIMING` (the run's own section included; renamed settings under their current
    name: :func:`lmrepro.results.run_settings`)."""
    config = summary.config
    flat = "settings" not in config and "model" not in config
    model = config.get("model") or {**FLAT_MODEL_FIXED,
                                    **{k: config[k] for k in MODEL_KEYS if k in config}}
    settings: dict[str, Any] = {}
    for part in (run_settings(config), config.get("run") or {}):
        for key, value in part.items():
            if key not in NOT_TIMING and key not in ("model", "run", "settings") \
                    and not (flat and key in MODEL_KEYS):
                settings[key] = value
    facts = {name: summary.details.fact(name) for name in registry.identity_facts()}
    return {"method": summary.method, **facts, "processes": summary.processes,
            "threads": summary.threads, "steps": summary.steps, "model": dict(model),
            "settings": settings}


def suite_identity(candidate: RunSummary, baseline: RunSummary) -> dict[str, Any]:
    """What makes two sessions' timings of a candidate against a baseline comparable: the
    corpus and each side's :func:`timing_configuration` (never the seed, the code version or
    the machine: the timing history matches the machine apart)."""
    return {"corpus": candidate.corpus, "candidate": timing_configuration(candidate),
            "baseline": timing_configuration(baseline)}


def suite_key(identity: Mapping[str, Any]) -> str:
    """A short key of a :func:`suite_identity`: the first 16 hex digits of the sha256 of its
    canonical JSON."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


RunSource = str | Path | Run
Runs = Mapping[str, RunSource]


def load_run(name: str, source: RunSource) -> Run:
    """Read one run directory (or pass a :class:`Run` through)."""
    if isinstance(source, Run):
        return source
    path = Path(source)
    check(path.is_dir(), f"runs[{name!r}]", str(path), "must be an existing run directory")
    summary = read_summary(path)
    test = (tuple(float(x) for x in read_json(path / EVAL_LOSSES_TEST)["losses"])
            if (path / EVAL_LOSSES_TEST).exists() else ())
    # a diverged run may have written no evaluation (RunSummary.diverged_at_step); a run
    # published without its validation losses is judged on its test losses alone (its
    # eval_losses stay empty, so a validation-split comparison skips it or refuses it by name)
    check((path / EVAL_LOSSES).exists() or summary.diverged_at_step is not None or bool(test),
          f"runs[{name!r}]", str(path), f"must hold {EVAL_LOSSES} (or {EVAL_LOSSES_TEST})")
    meta = (read_json(path / EVAL_LOSSES) if (path / EVAL_LOSSES).exists() else {"losses": []})
    return Run(name=name, path=path, summary=summary,
               role=run_role(summary.method, summary.details, f"{path / SUMMARY}: "),
               eval_losses=tuple(float(x) for x in meta.pop("losses")), eval_meta=meta,
               metrics=tuple(read_jsonl(path / METRICS)), test_losses=test)


def load_runs(runs: Runs) -> dict[str, Run]:
    """``{name: Run}`` for a mapping of run names to run directories (insertion order kept)."""
    check(isinstance(runs, Mapping), "runs", type(runs).__name__,
          "must be a mapping of run name -> run directory")
    return {name: load_run(name, src) for name, src in runs.items()}


def named_run(runs: dict[str, Run], name: str, what: str) -> Run:
    """The run called ``name`` (``what``: the argument that named it, for the message)."""
    check(name in runs, what, name, f"must name one of the runs passed in: {sorted(runs)}")
    return runs[name]


def workers(run: Run) -> str:
    """The compute of a run: data-parallel workers, or the threads of an RGC-suite run."""
    if run.world_size is not None:
        return f"{run.world_size} worker{'s' * (run.world_size != 1)}"
    return f"{run.summary.threads} threads"


def run_scale(run: Run) -> str:
    """The scale a run was measured at: parameters (when counted), model shape (``config.model``,
    or the flat RGC config), steps, corpus and :func:`workers`."""
    s = run.summary
    shape = s.config.get("model", s.config)
    parts = [f"{s.n_params / 1e6:.2f}M params"] if s.n_params else []
    if shape.get("n_layers") is not None and shape.get("d_model") is not None:
        parts.append(f"{shape['n_layers']} layers x d={shape['d_model']}")
    return ", ".join(parts + [f"{s.steps} steps", s.corpus, workers(run)])


# --------------------------------------------------------------------------------------------
# Labels and measures of one run
# --------------------------------------------------------------------------------------------

def learning_rate(run: Run) -> float | None:
    """The peak learning rate in the run's configuration (``settings.lr`` or ``lr``)."""
    lr = run_settings(run.summary.config).get("lr")
    return float(lr) if isinstance(lr, (int, float)) else None


def run_setting(run: Run) -> Any:
    """The run's setting: the fact of its details its wing names so
    (:func:`lmrepro.pipeline.registry.setting`; None when it names none or the run did not
    record it)."""
    name = registry.setting(run.role)
    return None if name is None else run.summary.details.fact(name)


def recorded_facts(run: Run) -> dict[str, Any]:
    """The facts of the run's details its wing has the analysis records keep
    (:func:`lmrepro.pipeline.registry.run_facts`), those the run recorded."""
    facts = {name: run.summary.details.fact(name) for name in registry.run_facts(run.role)}
    return {name: value for name, value in facts.items() if value is not None}


def config_label(run: Run, with_lr: bool = False) -> str:
    """A configuration in words: method, the details its role shows
    (:attr:`lmrepro.pipeline.registry.Role.label_details`), data-parallel workers (and the
    learning rate when ``with_lr``: where one method ran at several, e.g. a sweep)."""
    label = run.summary.method
    for form, fact in registry.role(run.role).label_details:
        if (value := run.summary.details.fact(fact)) is not None:
            label += form.format(value)
    if run.world_size is not None:
        label += f" p={run.world_size}"
    if with_lr and (lr := learning_rate(run)) is not None:
        label += f" lr={lr:g}"
    return label


def loss_spikes(metrics: Sequence[Mapping[str, Any]], window: int = 50,
                factor: float = 1.5) -> int:
    """Training-loss spikes of a run: logged steps whose loss exceeds ``factor`` times the
    median of the ``window`` logged losses before it (after the first ``window``); a
    non-finite loss counts too. The instability the SCAPE paper attributes to top-k."""
    losses = [float(r["loss"]) for r in metrics if "loss" in r]
    spikes = 0
    for i in range(window, len(losses)):
        ref = float(np.median(losses[i - window:i]))
        if not math.isfinite(losses[i]) or losses[i] > factor * ref:
            spikes += 1
    return spikes
