"""Configuration of an RGC run (docs/papers.md ("RGC")).

:class:`RGCConfig` (a :class:`lmrepro.evaluation.TrainingConfig`) holds the model (a
:class:`lmrepro.model.ModelConfig`, ``rgc.model``), the stage cut, the horizon, the optimizer, the
evaluation settings and the thread budget of every executor; :class:`RGCSuite`, the ``rgc:``
section of ``params.yaml``, adds the corpora and executors. Bad values raise
:class:`lmrepro.errors.ConfigError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from lmrepro.config import Section, field_error
from lmrepro.errors import check
from lmrepro.evaluation import TrainingConfig
from lmrepro.model import ModelConfig

EXECUTORS = ("sync", "async", "backprop", "pipelined_backprop")
#: the executors that run on worker processes (placement, threads per worker)
MULTI_PROCESS = ("async", "pipelined_backprop")
MAX_STALENESS = 8


class ThreadOversubscriptionWarning(RuntimeWarning):
    """More worker threads were asked for than the machine has cores."""


class RGCConfig(TrainingConfig):
    """Everything one RGC (or matched global-backprop) run needs; the seed is the run's argument.

    ``horizon`` H in ``[1, n_stages]``: the gradient of stage k's loss reaches stages
    ``k-H+1 .. k`` (1 = purely local, ``n_stages`` = global backprop through all stages).
    ``batch_size`` sequences per step are split into ``micro_batches`` (the async executor streams
    them through the stage queues).

    Placement (async executor): the K stages run on W worker processes, worker w holding the next
    ``stages_per_worker[w]`` consecutive stages (null: one stage per worker) with
    ``threads[w]`` intra-op threads (null: 1 each). ``backprop_threads``: threads of
    the single-process executors (sync and backprop; null: the async total, the same core
    budget). ``cores``: the core budget the configuration is sized for; every thread count must
    fit in it (null: this machine's cores, and exceeding them only warns).
    ``consensus_staleness`` s: the decoder is updated at step t with the consensus gradient of
    step t - s (0: in lockstep, every step; docs/rgc.md, "Stale consensus"); with H > 1 the
    workers also run ahead of each other, each taking the gradients that cross workers s steps
    late (:attr:`stage_gradient_delays`; docs/rgc.md, "Running ahead").
    """

    key: ClassVar[str] = "rgc"
    renamed: ClassVar[dict[str, str]] = {
        "threads_per_worker": "use threads (one count per async worker)",
        "worker_timeout_s": "use timeout_s (the same seconds)",
        **{k: f"use model.{k} (the model is a ModelConfig, rgc.model)"
           for k in ("n_layers", "d_model", "n_heads", "context", "mlp_ratio")}}

    model: ModelConfig = Field(default_factory=ModelConfig, description="the model; n_layers L "
                               "a multiple of n_stages, dropout 0, embeddings untied")
    n_stages: int = Field(default=4, ge=1, description="stages K; must divide model.n_layers")
    horizon: int = Field(default=1, ge=1, description="stages a local loss reaches back")
    micro_batches: int = Field(default=4, ge=1, description="must divide batch_size")
    stages_per_worker: list[int] | None = Field(
        default=None, description="async: consecutive stages of each worker process, summing "
        "to n_stages; null for one stage per worker")
    threads: list[int] | None = Field(
        default=None, description="async: intra-op threads of each worker process; null for 1 "
        "each")
    backprop_threads: int | None = Field(default=None, ge=1, description="sync/backprop "
                                         "threads; null for sum(threads)")
    cores: int | None = Field(default=None, ge=1, description="core budget the thread counts "
                              "must fit; null for this machine's cores (then only a warning)")
    consensus_staleness: int = Field(default=0, ge=0, le=MAX_STALENESS,
                                     description="steps by which the decoder's consensus "
                                     "gradient is applied late (0: lockstep)")
    queue_size: int = Field(default=2, ge=1, description="async: micro-batches per queue")
    eval_every: int = Field(default=0, ge=0, description="evaluate every this many steps; 0: "
                            "only at the end")
    timeout_s: float = Field(default=300.0, gt=0.0, description="an async worker waiting this "
                             "long on a queue or collective fails the run")
    local_loss_weight: float = Field(
        default=1.0, ge=0.0, allow_inf_nan=False, description="weight lambda of the "
        "intermediate stages' local losses (the last stage's, the model's own loss, keeps "
        "weight 1); the decoder's consensus is the readout gradients' mean weighted alike. 1: "
        "RGC as published; 0 at horizon = n_stages: global backprop of the model's loss")

    @field_validator("stages_per_worker", "threads", mode="before")
    @classmethod
    def _tuple_to_list(cls, v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    @model_validator(mode="after")
    def _rgc_model(self) -> RGCConfig:
        """RGC's model has untied embeddings (the decoder is a separate replica every stage reads
        out through, so its weights cannot be the embedding's) and no dropout (deterministic
        runs). Other values are refused rather than forced to these (as ``model_shape()`` once
        did): a setting is never silently ignored, and ``rgc.model`` is the model that is built
        and recorded."""
        if self.model.tie_embeddings:
            raise field_error("model.tie_embeddings", True, "must be false: RGC's decoder is a "
                              "separate replica every stage reads out through")
        if self.model.dropout > 0:
            raise field_error("model.dropout", self.model.dropout, "must be 0.0: RGC runs are "
                              "deterministic (every executor computes the same model)")
        return self

    @model_validator(mode="after")
    def _cross_field(self) -> RGCConfig:
        n_layers = self.model.n_layers
        if n_layers % self.n_stages:
            raise field_error("n_stages", self.n_stages,
                              f"must divide model.n_layers = {n_layers} (each stage holds "
                              "n_layers/n_stages blocks)")
        if self.horizon > self.n_stages:
            raise field_error("horizon", self.horizon,
                              f"must be an integer in [1, n_stages = {self.n_stages}]")
        if self.batch_size % self.micro_batches:
            raise field_error("micro_batches", self.micro_batches,
                              f"must divide batch_size = {self.batch_size}")
        spw = self.stages_per_worker
        if spw is not None and (any(s < 1 for s in spw) or sum(spw) != self.n_stages):
            raise field_error("stages_per_worker", spw,
                              f"must be integers >= 1 summing to n_stages = {self.n_stages} "
                              "(worker w runs the next stages_per_worker[w] consecutive "
                              "stages, so together they cover every stage once, in order), "
                              "or null for one stage per worker")
        tpw = self.threads
        if tpw is not None and (len(tpw) != self.n_workers or any(t < 1 for t in tpw)):
            raise field_error("threads", tpw,
                              f"must be {self.n_workers} integers >= 1 (one per worker of "
                              f"stages_per_worker = {self.stages_per_worker}), or null for 1 "
                              "each")
        if self.cores is not None:
            if self.async_threads > self.cores:
                raise field_error("threads", list(self.worker_threads),
                                  f"must fit cores = {self.cores}: {self.async_threads} threads "
                                  "in total over the async workers (allowed: a total <= cores)")
            if self.single_process_threads > self.cores:
                raise field_error("backprop_threads", self.backprop_threads,
                                  f"must fit cores = {self.cores} (allowed: 1 .. {self.cores})")
        if self.consensus_staleness >= self.steps:
            raise field_error("consensus_staleness", self.consensus_staleness,
                              f"must be < steps = {self.steps} (the decoder would never learn)")
        if max(self.stage_gradient_delays) >= self.steps:
            raise field_error("consensus_staleness", self.consensus_staleness,
                              f"must leave stage 0 a gradient: with horizon {self.horizon} > 1 "
                              f"its worker takes gradients {max(self.stage_gradient_delays)} "
                              f"steps late (s x (workers - 1)), which must be < steps = "
                              f"{self.steps}")
        return self

    @model_validator(mode="after")
    def _every_stage_learns(self) -> RGCConfig:
        """With lambda = 0 only the last stage's loss trains, and it reaches stages
        ``K-H .. K-1``: below a full horizon the stages under its window would get no gradient."""
        if self.local_loss_weight == 0 and self.horizon < self.n_stages:
            raise field_error("local_loss_weight", self.local_loss_weight,
                              f"must be > 0 at horizon {self.horizon} < n_stages = "
                              f"{self.n_stages} (with 0 only the last stage's loss trains, and "
                              f"stages 0..{self.n_stages - self.horizon - 1} would get no "
                              "gradient); 0 needs horizon = n_stages")
        return self

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`Section.to_dict`, without the settings added after runs were published when
        they are at their defaults (:data:`NEWER_DEFAULTS`): the identities and records of the
        runs trained before them stay the same, so those runs are kept."""
        out = super().to_dict()
        for name, default in NEWER_DEFAULTS.items():
            if out.get(name) == default:
                del out[name]
        return out

    # -- derived ---------------------------------------------------------------------------
    @property
    def loss_weights(self) -> list[float]:
        """w_k of each stage's local loss: ``local_loss_weight`` for stages 0..K-2, 1 for the
        last stage (its readout is the model's own loss)."""
        return [self.local_loss_weight] * (self.n_stages - 1) + [1.0]

    @property
    def consensus_divisor(self) -> float:
        """What the sum of the stages' (weighted) readout gradients is divided by to give the
        decoder's consensus gradient: ``sum_k w_k`` (K at lambda = 1: the plain mean)."""
        return float(sum(self.loss_weights))

    @property
    def layers_per_stage(self) -> int:
        return self.model.n_layers // self.n_stages

    @property
    def n_workers(self) -> int:
        """W: async worker processes."""
        return len(self.stages_per_worker) if self.stages_per_worker else self.n_stages

    @property
    def placement(self) -> list[list[int]]:
        """The stages of each worker, e.g. ``[[0, 1], [2, 3]]``."""
        sizes = self.stages_per_worker or [1] * self.n_stages
        bounds = [sum(sizes[:w]) for w in range(len(sizes) + 1)]
        return [list(range(bounds[w], bounds[w + 1])) for w in range(len(sizes))]

    @property
    def stage_gradient_delays(self) -> list[int]:
        """Steps by which each stage's own gradients arrive late. With H > 1 and
        ``consensus_staleness`` s > 0 the workers run ahead: worker w backpropagates the graphs of
        step t - s x (W - 1 - w) at step t (the gradients from the worker above arrive s steps
        after it computed them, and so on up the pipeline), so its stages are updated with the
        gradient of weights that many steps old (docs/rgc.md, "Running ahead"). 0 for every
        stage in lockstep (s = 0), at H = 1 (no gradient crosses a worker) and on the last
        worker."""
        s, W = self.consensus_staleness, self.n_workers
        if self.horizon == 1 or s == 0:
            return [0] * self.n_stages
        return [s * (W - 1 - w) for w, stages in enumerate(self.placement) for _ in stages]

    @property
    def runs_ahead(self) -> bool:
        """Whether the workers take gradients from each other late (see
        :attr:`stage_gradient_delays`)."""
        return any(self.stage_gradient_delays)

    @property
    def queue_capacity(self) -> int:
        """Messages each queue between two async workers holds: ``queue_size``; running ahead
        by s steps at least (s + 1) x M. A worker reads its neighbour's gradients s steps after
        they were sent and can be s steps ahead of it, so up to s + 1 steps of messages are in
        flight on either queue; a smaller bound would make the sender wait for a reader that
        waits for it."""
        if not self.runs_ahead:
            return self.queue_size
        return max(self.queue_size, (self.consensus_staleness + 1) * self.micro_batches)

    @property
    def worker_threads(self) -> tuple[int, ...]:
        return tuple(self.threads or (1,) * self.n_workers)

    @property
    def async_threads(self) -> int:
        """Intra-op threads of all async workers together."""
        return sum(self.worker_threads)

    @property
    def single_process_threads(self) -> int:
        """Threads of the sync and backprop executors: by default the same total as async."""
        return self.backprop_threads or self.async_threads

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.micro_batches


#: Settings added after runs were published, left out of records and identities at these defaults
NEWER_DEFAULTS: dict[str, Any] = {"local_loss_weight": 1.0}


# -- the training-length study (lmrepro.rgc.study.scaling) -----------------------------------------

class RGCStudyRun(Section):
    """One method of the study: an executor, its horizon and consensus staleness, its lr."""

    key: ClassVar[str] = "rgc.scaling.runs[]"

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    executor: Literal["sync", "async", "backprop"] = Field(description="sync computes what "
                                                            "async does; quality runs use it")
    horizon: int | None = Field(default=None, ge=1, description="the run's horizon H (null: "
                                "the rgc section's)")
    consensus_staleness: int = Field(default=0, ge=0)
    local_loss_weight: float | None = Field(default=None, ge=0.0, allow_inf_nan=False,
                                            description="the run's weight of the intermediate "
                                            "stages' local losses (null: the rgc section's)")
    lr: float = Field(gt=0.0)

    def loss_weight_in(self, section: RGCConfig) -> float:
        """The run's ``local_loss_weight``: its own, or ``section``'s."""
        return section.local_loss_weight if self.local_loss_weight is None \
            else self.local_loss_weight


class RGCScaling(Section):
    """The ``rgc.scaling`` section (see the module docstring)."""

    key: ClassVar[str] = "rgc.scaling"
    renamed: ClassVar[dict[str, str]] = {"threads_per_run": "use threads (the same count)"}

    sizes: dict[str, ModelConfig] = Field(min_length=1, description="model sizes by name, "
                                          "each a run's whole model (n_layers a multiple of "
                                          "n_stages)")
    lengths: dict[str, list[int]] = Field(description="training lengths (optimizer steps) per "
                                          "size, increasing")
    runs: list[RGCStudyRun] = Field(min_length=2, description="the methods (each at its lr)")
    baseline: str = Field(default="backprop", description="the run every other is judged "
                          "against")
    seeds: dict[str, list[int]] = Field(description="seeds of every point, per size")
    verdict_size: str = Field(description="the size whose longest length takes the verdict")
    verdict_seeds: list[int] = Field(min_length=1, description="seeds of the verdict point")
    warmup_fraction: float = Field(default=0.05, ge=0.0, lt=1.0, description="lr warm-up as a "
                                   "fraction of the run")
    sweep_factors: list[float] = Field(default_factory=list, description="lr sweep at the "
                                       "verdict point: these multiples of each run's lr (empty: "
                                       "no sweep)")
    sweep_seed: int = Field(default=1000, ge=0, description="the sweep's seed (not a study seed)")
    edge_check: bool = Field(default=True, description="last: train each sweep winner on the "
                             "grid's edge one grid step beyond it (reported, not applied)")
    parallel: int = Field(default=2, ge=1, description="runs trained at once")
    threads: int = Field(default=1, ge=1, description="intra-op threads of each run")

    @model_validator(mode="after")
    def _consistent(self) -> RGCScaling:
        from lmrepro.pipeline.study_section import check_points, check_sweep_factors, study_seeds

        check_points(self, ("lengths", "seeds"))
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise field_error("runs", names, "must have distinct names")
        if self.baseline not in names:
            raise field_error("baseline", self.baseline, f"must be one of the runs {names}")
        check_sweep_factors(self)
        if self.sweep_seed in study_seeds(self):
            raise field_error("sweep_seed", self.sweep_seed, "must not be a study seed")
        return self

    @property
    def verdict_steps(self) -> int:
        return self.lengths[self.verdict_size][-1]


class RGCSuite(RGCConfig):
    """The ``rgc:`` section: the run settings, the corpora and the executors to run on each."""

    corpora: list[str] = Field(min_length=1, description="prepared corpora, one suite each")
    executors: list[Literal["async", "sync", "backprop"]] = Field(
        min_length=1, description="async RGC, sync RGC and/or global backprop")
    scaling: RGCScaling | None = Field(default=None, description="the training-length study "
                                       "(lmrepro.rgc.study.scaling; null: none in this profile)")

    @model_validator(mode="after")
    def _study_shapes(self) -> RGCSuite:
        """Every size of the study is a valid model with this section's stage cut, and every
        run's horizon and staleness a valid configuration at each size's shortest length."""
        if self.scaling is None:
            return self
        base = {k: getattr(self, k) for k in RGCConfig.model_fields if k != "backprop_threads"}
        for name, shape in self.scaling.sizes.items():
            try:
                RGCConfig(**base | {"model": shape})
            except ValueError as err:
                raise field_error(f"scaling.sizes.{name}", shape.to_dict(),
                                  f"must make a valid model with n_stages = "
                                  f"{self.n_stages}: {str(err).splitlines()[-1].strip()}"
                                  ) from None
            for i, run in enumerate(self.scaling.runs):
                try:
                    RGCConfig(**base | {"model": shape, "steps": self.scaling.lengths[name][0],
                                        "horizon": run.horizon or self.horizon,
                                        "consensus_staleness": run.consensus_staleness,
                                        "local_loss_weight": run.loss_weight_in(self)})
                except ValueError as err:
                    raise field_error(f"scaling.runs[{i}] ({run.name})", {
                        "horizon": run.horizon, "consensus_staleness": run.consensus_staleness,
                        "local_loss_weight": run.local_loss_weight},
                        f"must make a valid run at size {name}: "
                        f"{str(err).splitlines()[-1].strip()}") from None
        return self

    @model_validator(mode="after")
    def _fits_this_machine(self) -> RGCSuite:
        """A suite sized for this machine (``cores`` null) that oversubscribes it warns here, at
        ``lmrepro validate``; one sized for a declared ``cores`` warns when it runs
        (:func:`check_threads`)."""
        if self.cores is None:
            for executor in self.executors:
                check_threads(self, executor, stacklevel=4)
        return self

    @property
    def config(self) -> RGCConfig:
        """The run settings alone (what each executor receives)."""
        return RGCConfig(**{k: getattr(self, k) for k in RGCConfig.model_fields})


def check_executor(executor: str) -> None:
    check(executor in EXECUTORS, "executor", executor, f"must be one of {list(EXECUTORS)}")


def check_threads(config: RGCConfig, executor: str, cores: int | None = None,
                  stacklevel: int = 3) -> int:
    """Total intra-op threads the executor will run on this machine (``cores``: default
    ``os.cpu_count()``). Warns (:class:`ThreadOversubscriptionWarning`) when that exceeds the
    machine's cores, naming the parameter, the value, the core count and, when the configuration
    declares the budget it was sized for (``rgc.cores``), that budget."""
    machine = cores or os.cpu_count() or 1
    if executor in MULTI_PROCESS:
        total, name, value = config.async_threads, "rgc.threads", \
            list(config.worker_threads)
    else:
        total = config.single_process_threads
        name = "rgc.backprop_threads" if config.backprop_threads else "rgc.threads"
        value = config.backprop_threads or list(config.worker_threads)
    if total > machine:
        sized = (f" (rgc.cores = {config.cores}: the configuration is sized for {config.cores} "
                 "cores)" if config.cores is not None else "")
        warnings.warn(
            f"{name} = {value!r}: {total} threads asked for the {executor} executor but this "
            f"machine has {machine} cores{sized}; the run is oversubscribed and its throughput "
            "is not representative (allowed without oversubscription: a total <= "
            f"{machine})", ThreadOversubscriptionWarning, stacklevel=stacklevel)
    return total
