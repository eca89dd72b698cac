"""Configuration of an RGC run (DESIGN.md, "RGC, reference design").

One frozen dataclass holds the model shape, the stage cut, the horizon, the optimizer, the data and
evaluation settings and the thread budget of every executor. Bad values raise
:class:`lmrepro.errors.ParameterError` naming the parameter, the value and what is allowed.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any

from lmrepro.errors import check
from lmrepro.model import ModelConfig

EXECUTORS = ("sync", "async", "backprop")


class ThreadOversubscriptionWarning(RuntimeWarning):
    """More worker threads were asked for than the machine has cores."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class RGCConfig:
    """Everything an RGC (or matched global-backprop) run needs.

    Attributes:
        n_layers: transformer blocks ``L`` (24 in the paper).
        n_stages: stages ``K`` (4 in the paper); must divide ``n_layers``.
        horizon: ``H`` in ``[1, n_stages]``: the gradient of stage ``k``'s loss reaches stages
            ``k-H+1 .. k``. 1 = purely local, ``n_stages`` = global backprop through all stages.
        d_model, n_heads, context, mlp_ratio: model shape (see :class:`lmrepro.model.ModelConfig`).
        lr, min_lr_ratio, warmup_steps: cosine schedule (:func:`lmrepro.evaluation.cosine_lr`).
        weight_decay, beta1, beta2, eps: AdamW (decay on matrices and embeddings only).
        steps: optimizer steps.
        batch_size: sequences per optimizer step; split into ``micro_batches`` equal micro-batches
            (the async executor streams micro-batches through the stage queues).
        threads_per_stage: intra-op threads of each stage worker (async); ``None`` = 1 each.
        backprop_threads: threads of the single-process executors (sync and backprop);
            ``None`` = ``sum(threads_per_stage)``, the same total core budget.
        queue_size: capacity (micro-batches) of each bounded activation queue (async).
        seed: seeds the initialisation and the training-batch generator.
        eval_batch_size, eval_batches: the fixed evaluation set (paired across methods).
        eval_interval: evaluate every this many steps (0 = only at the end).
        checkpoint_interval: with an out dir, checkpoint every this many steps (0 = never).
        worker_timeout_s: an async stage waiting this long on a queue or collective fails the run.
    """

    n_layers: int = 24
    n_stages: int = 4
    horizon: int = 1
    d_model: int = 128
    n_heads: int = 4
    context: int = 128
    mlp_ratio: int = 4
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    steps: int = 200
    batch_size: int = 16
    micro_batches: int = 4
    threads_per_stage: tuple[int, ...] | None = None
    backprop_threads: int | None = None
    queue_size: int = 2
    seed: int = 0
    eval_batch_size: int = 16
    eval_batches: int = 16
    eval_interval: int = 0
    checkpoint_interval: int = 50
    worker_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_stages", "horizon", "d_model", "n_heads", "context",
                     "mlp_ratio", "steps", "batch_size", "micro_batches", "queue_size",
                     "eval_batch_size", "eval_batches"):
            v = getattr(self, name)
            check(_is_int(v) and v >= 1, f"rgc.{name}", v, "must be an integer >= 1")
        check(self.n_layers % self.n_stages == 0, "rgc.n_stages", self.n_stages,
              f"must divide rgc.n_layers = {self.n_layers} (each stage holds n_layers/n_stages "
              "blocks)")
        check(1 <= self.horizon <= self.n_stages, "rgc.horizon", self.horizon,
              f"must be an integer in [1, rgc.n_stages = {self.n_stages}]")
        check(self.batch_size % self.micro_batches == 0, "rgc.micro_batches", self.micro_batches,
              f"must divide rgc.batch_size = {self.batch_size}")
        check(isinstance(self.lr, (int, float)) and self.lr > 0, "rgc.lr", self.lr,
              "must be a number > 0")
        check(0.0 <= self.min_lr_ratio <= 1.0, "rgc.min_lr_ratio", self.min_lr_ratio,
              "must be in [0, 1]")
        check(_is_int(self.warmup_steps) and self.warmup_steps >= 0, "rgc.warmup_steps",
              self.warmup_steps, "must be an integer >= 0")
        check(self.weight_decay >= 0, "rgc.weight_decay", self.weight_decay, "must be >= 0")
        check(0.0 <= self.beta1 < 1.0, "rgc.beta1", self.beta1, "must be in [0, 1)")
        check(0.0 <= self.beta2 < 1.0, "rgc.beta2", self.beta2, "must be in [0, 1)")
        check(self.eps > 0, "rgc.eps", self.eps, "must be > 0")
        check(_is_int(self.seed) and self.seed >= 0, "rgc.seed", self.seed,
              "must be an integer >= 0")
        for name in ("eval_interval", "checkpoint_interval"):
            v = getattr(self, name)
            check(_is_int(v) and v >= 0, f"rgc.{name}", v, "must be an integer >= 0")
        check(self.worker_timeout_s > 0, "rgc.worker_timeout_s", self.worker_timeout_s,
              "must be > 0 seconds")
        if self.threads_per_stage is not None:
            tps = tuple(self.threads_per_stage)
            object.__setattr__(self, "threads_per_stage", tps)
            check(len(tps) == self.n_stages and all(_is_int(t) and t >= 1 for t in tps),
                  "rgc.threads_per_stage", list(tps),
                  f"must be {self.n_stages} integers >= 1 (one per stage), or null for 1 each")
        if self.backprop_threads is not None:
            check(_is_int(self.backprop_threads) and self.backprop_threads >= 1,
                  "rgc.backprop_threads", self.backprop_threads,
                  "must be an integer >= 1, or null for sum(threads_per_stage)")
        ModelConfig(**self.model_kwargs())  # validates n_heads | d_model etc.

    # -- derived ---------------------------------------------------------------------------
    def model_kwargs(self) -> dict:
        return dict(n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                    context=self.context, mlp_ratio=self.mlp_ratio, dropout=0.0,
                    tie_embeddings=False)

    def model_config(self) -> ModelConfig:
        """The :class:`ModelConfig`; untied embeddings so the decoder is a separate replica."""
        return ModelConfig(**self.model_kwargs())

    @property
    def layers_per_stage(self) -> int:
        return self.n_layers // self.n_stages

    @property
    def stage_threads(self) -> tuple[int, ...]:
        return self.threads_per_stage or (1,) * self.n_stages

    @property
    def single_process_threads(self) -> int:
        """Threads of the sync and backprop executors: the same total budget as async."""
        return self.backprop_threads or sum(self.stage_threads)

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.micro_batches

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["threads_per_stage"] is not None:
            d["threads_per_stage"] = list(d["threads_per_stage"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RGCConfig":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        check(not unknown, "rgc", unknown, f"unknown keys; allowed: {sorted(known)}")
        d = dict(d)
        if d.get("threads_per_stage") is not None:
            d["threads_per_stage"] = tuple(d["threads_per_stage"])
        return cls(**d)

    def replace(self, **kw: Any) -> "RGCConfig":
        return replace(self, **kw)


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
