"""Configuration of an RGC run (DESIGN.md, "RGC, reference design").

:class:`RGCConfig` (a :class:`lmrepro.evaluation.TrainingConfig`) holds the model shape, the
stage cut, the horizon, the optimizer, the evaluation settings and the thread budget of every
executor; :class:`RGCSuite`, the ``rgc:`` section of ``params.yaml``, adds the corpora and
executors. Bad values raise :class:`lmrepro.errors.ConfigError` naming the key, the value and
what is allowed.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from lmrepro.config import field_error
from lmrepro.errors import check
from lmrepro.evaluation import TrainingConfig
from lmrepro.model import ModelConfig

EXECUTORS = ("sync", "async", "backprop")


class ThreadOversubscriptionWarning(RuntimeWarning):
    """More worker threads were asked for than the machine has cores."""


class RGCConfig(TrainingConfig):
    """Everything one RGC (or matched global-backprop) run needs; the seed is the run's argument.

    ``horizon`` H in ``[1, n_stages]``: the gradient of stage k's loss reaches stages
    ``k-H+1 .. k`` (1 = purely local, ``n_stages`` = global backprop through all stages).
    ``batch_size`` sequences per step are split into ``micro_batches`` (the async executor streams
    them through the stage queues). ``threads_per_stage``: intra-op threads of each async stage
    worker (null = 1 each); ``backprop_threads``: threads of the single-process executors (sync and
    backprop; null = ``sum(threads_per_stage)``, the same total core budget).
    """

    key: ClassVar[str] = "rgc"

    n_layers: int = Field(default=24, ge=1, description="transformer blocks L")
    n_stages: int = Field(default=4, ge=1, description="stages K; must divide n_layers")
    horizon: int = Field(default=1, ge=1, description="stages a local loss reaches back")
    d_model: int = Field(default=128, ge=8)
    n_heads: int = Field(default=4, ge=1)
    context: int = Field(default=128, ge=2)
    mlp_ratio: int = Field(default=4, ge=1)
    micro_batches: int = Field(default=4, ge=1, description="must divide batch_size")
    threads_per_stage: list[int] | None = Field(default=None, description="async: threads of "
                                                "each stage worker; null for 1 each")
    backprop_threads: int | None = Field(default=None, ge=1, description="sync/backprop "
                                         "threads; null for sum(threads_per_stage)")
    queue_size: int = Field(default=2, ge=1, description="async: micro-batches per queue")
    eval_every: int = Field(default=0, ge=0, description="evaluate every this many steps; 0: "
                            "only at the end")
    worker_timeout_s: float = Field(default=300.0, gt=0.0, description="an async stage waiting "
                                    "this long on a queue or collective fails the run")

    @field_validator("threads_per_stage", mode="before")
    @classmethod
    def _tuple_to_list(cls, v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    @model_validator(mode="after")
    def _cross_field(self) -> RGCConfig:
        if self.n_layers % self.n_stages:
            raise field_error("n_stages", self.n_stages,
                              f"must divide n_layers = {self.n_layers} (each stage holds "
                              "n_layers/n_stages blocks)")
        if self.horizon > self.n_stages:
            raise field_error("horizon", self.horizon,
                              f"must be an integer in [1, n_stages = {self.n_stages}]")
        if self.batch_size % self.micro_batches:
            raise field_error("micro_batches", self.micro_batches,
                              f"must divide batch_size = {self.batch_size}")
        tps = self.threads_per_stage
        if tps is not None and (len(tps) != self.n_stages or any(t < 1 for t in tps)):
            raise field_error("threads_per_stage", tps, f"must be {self.n_stages} integers >= 1 "
                              "(one per stage), or null for 1 each")
        if self.d_model % self.n_heads:
            raise field_error("n_heads", self.n_heads, f"must divide d_model = {self.d_model}")
        return self

    # -- derived ---------------------------------------------------------------------------
    def model_shape(self) -> ModelConfig:
        """The :class:`ModelConfig`; untied embeddings so the decoder is a separate replica."""
        return ModelConfig(n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                           context=self.context, mlp_ratio=self.mlp_ratio, dropout=0.0,
                           tie_embeddings=False)

    @property
    def layers_per_stage(self) -> int:
        return self.n_layers // self.n_stages

    @property
    def stage_threads(self) -> tuple[int, ...]:
        return tuple(self.threads_per_stage or (1,) * self.n_stages)

    @property
    def single_process_threads(self) -> int:
        """Threads of the sync and backprop executors: the same total budget as async."""
        return self.backprop_threads or sum(self.stage_threads)

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.micro_batches


class RGCSuite(RGCConfig):
    """The ``rgc:`` section: the run settings, the corpora and the executors to run on each."""

    corpora: list[str] = Field(min_length=1, description="prepared corpora, one suite each")
    executors: list[Literal["async", "sync", "backprop"]] = Field(
        min_length=1, description="async RGC, sync RGC and/or global backprop")

    @model_validator(mode="after")
    def _async_horizon(self) -> RGCSuite:
        if "async" in self.executors and self.horizon != 1:
            raise field_error("horizon", self.horizon, "must be 1 when executors include "
                              "'async' (the async executor exchanges only detached "
                              "activations); run a horizon > 1 with executor 'sync'")
        return self

    @property
    def config(self) -> RGCConfig:
        """The run settings alone (what each executor receives)."""
        return RGCConfig(**{k: getattr(self, k) for k in RGCConfig.model_fields})


def check_executor(executor: str) -> None:
    check(executor in EXECUTORS, "executor", executor, f"must be one of {list(EXECUTORS)}")


def check_threads(config: RGCConfig, executor: str, cores: int | None = None) -> int:
    """Total threads the executor will run; warns (``ThreadOversubscriptionWarning``) when that
    exceeds the machine's cores, naming the parameter, the value and the core count."""
    cores = cores or os.cpu_count() or 1
    if executor == "async":
        total, name, value = sum(config.stage_threads), "rgc.threads_per_stage", \
            list(config.stage_threads)
    else:
        total = config.single_process_threads
        name = "rgc.backprop_threads" if config.backprop_threads else "rgc.threads_per_stage"
        value = config.backprop_threads or list(config.stage_threads)
    if total > cores:
        warnings.warn(
            f"{name} = {value!r}: {total} threads asked for the {executor} executor but this "
            f"machine has {cores} cores; the run is oversubscribed and its throughput is not "
            "representative (allowed without oversubscription: a total <= the core count)",
            ThreadOversubscriptionWarning, stacklevel=3)
    return total
