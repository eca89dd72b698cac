"""Settings of the SCAPE comparison: the ``scape:`` section of ``params.yaml``.

:class:`ScapeConfig` holds what every run of the suite shares (the ``train-scape`` flags of the
same names): the schedule, the clipping, the weight decay and SCAPE's own options (sparsity
schedule, bias correction, 1-D exclusion), so that every method of the comparison trains under
the same harness. :class:`ScapeRun` holds what one run chooses: the method, its sparsity, its mask
rule or inner optimizer, and its own learning rate. :class:`ScapeSweep` is the optional
learning-rate sweep (:mod:`lmrepro.scape.train.sweep`), :class:`ScapeSuite` the whole section.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from lmrepro.config import Section, field_error
from lmrepro.evaluation import TrainingConfig
from lmrepro.model import ModelConfig
from lmrepro.scape.roles import ScapeMethod as Method

OPTIMIZERS = ("adamw", "adams", "scape", "topk")
DENSE = ("adamw", "adams")
SPARSE_OPTIMIZERS = ("scape", "topk")


class ScapeConfig(TrainingConfig):
    """Hyper-parameters shared by every run of the suite (one ``train-scape`` worker each);
    ``batch_size`` is per worker, ``lr`` the default of runs that do not set their own."""

    key: ClassVar[str] = "scape"

    timeout_s: float = Field(default=60.0, gt=0.0, description="process-group timeout: a dead "
                             "or stalled peer fails the run after this")
    threads: int = Field(default=1, ge=1, description="torch threads per worker")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda "
                                                   "when available (NCCL), else cpu (gloo)")
    max_grad_norm: float | None = Field(default=1.0, gt=0.0, description="clip the averaged "
                                        "(SCAPE: synced) gradient to this global norm, every "
                                        "method alike; null: no clipping")
    bias_correction: bool = Field(default=True, description="Adam bias correction in SCAPE and "
                                  "in the AdamS of the dense and top-k baselines (the SCAPE "
                                  "authors'); false: AdamS's formula")
    exclude_1d_from_topk: bool = Field(default=True, description="SCAPE and top-k send 1-D "
                                       "tensors (norms, biases) whole every step")
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="fp32: every computation in float32; bf16: the forward "
        "and backward passes under bfloat16 autocast, the master weights, optimizer state and "
        "gradient all-reduce in float32 (the SCAPE authors' GPU runs)")
    compile: bool = Field(default=False, description="torch.compile the training forward "
                          "pass (evaluation stays eager; parameters are shared)")
    renamed: ClassVar[dict[str, str]] = {
        "density_start": "use sparsity_start = 1 - density_start",
        "density_warmup_steps": "use sparsity_warmup_steps (the same steps)"}

    eval_at: list[int] = Field(default_factory=list, description="step counts after which "
                               "the validation and test splits are scored during the run "
                               "(a loss curve for steps-to-target); the final model is always "
                               "scored")

    keep_checkpoints_at: list[int] = Field(default_factory=list, description="step counts "
                                           "after which a checkpoint is kept out of the "
                                           "rotation, in OUT/kept_checkpoints/ (a stable "
                                           "run's branch points: lmrepro.scape.study.branches)")

    dense_steps: int = Field(default=0, ge=0, description="sparse methods (SCAPE, top-k): "
                             "dense steps before the sparsity schedule starts")
    sparsity_start: float = Field(default=0.0, ge=0.0, lt=1.0, description="sparse methods: "
                                  "sparsity at the start of the warm-up (0: dense)")
    sparsity_warmup_steps: int = Field(default=0, ge=0, description="sparse methods: steps of "
                                       "the linear sparsity warm-up from sparsity_start to "
                                       "the run's sparsity")


    def to_dict(self) -> dict[str, Any]:
        """As :meth:`Section.to_dict`, without the settings of :data:`NEWER_DEFAULTS` at their
        defaults (fp32, eager, no kept checkpoints): the identities and records of the runs
        trained before they existed stay the same, so those runs are kept."""
        out = super().to_dict()
        for name, default in NEWER_DEFAULTS.items():
            if out.get(name) == default:
                del out[name]
        return out

    @model_validator(mode="after")
    def _eval_points(self) -> ScapeConfig:
        for name in ("eval_at", "keep_checkpoints_at"):
            pts = getattr(self, name)
            if pts and (sorted(set(pts)) != pts or pts[0] < 1 or pts[-1] >= self.steps):
                raise field_error(name, pts, f"must be distinct step counts in [1, "
                                  f"{self.steps - 1}] (below steps = {self.steps}), increasing")
        return self


#: Settings added after runs were published, left out of records at these defaults
NEWER_DEFAULTS: dict[str, Any] = {"precision": "fp32", "compile": False,
                                   # keeping checkpoints changes no number
                                   "keep_checkpoints_at": []}

#: Settings a resumed run may change (they do not change the numbers).
RESUME_FREE = ("timeout_s", "threads", "device", "checkpoint_every", "keep_checkpoints_at")


class ScapeRun(Section):
    """One run of the suite: the method, its sparsity, its variant and its learning rate."""

    key: ClassVar[str] = "scape.runs[]"

    name: str = Field(default="", description="run name (default: from method and sparsity)")
    optimizer: Literal["adamw", "adams", "scape", "topk"] = Field(description="the method")
    sparsity: float = Field(default=0.0, ge=0.0, lt=1.0, description="fraction of coordinates "
                            "not sent per step (0 for the dense optimizers)")
    lr: float | None = Field(default=None, gt=0.0, le=1.0, description="this run's peak "
                             "learning rate (null: the section's lr)")
    mask_rule: Literal["ef_momentum", "stale_m"] = Field(
        default="ef_momentum", description="SCAPE's mask rule: ef_momentum (the authors') or "
        "stale_m (the ablation)")
    topk_inner: Literal["adams", "adamw"] = Field(default="adams", description="top-k's inner "
                                                  "optimizer (adams: the paper's foil)")
    decay_scope: Literal["all", "mask"] = Field(
        default="all", description="SCAPE's weight decay: all (the authors': every coordinate, "
        "every step) or mask (an ablation: only the coordinates updated this step)")
    off_mask_momentum: Literal["zero", "decay"] | None = Field(
        default=None, description="the first moment off the coordinates sent: zero (SCAPE's "
        "rule) or decay (m <- b1 m: top-k's inner optimizer's own); null: the method's own")
    dense_steps: int | None = Field(default=None, ge=0, description="this run's dense steps "
                                    "before its sparsity schedule (null: the section's)")

    @model_validator(mode="after")
    def _consistent(self) -> ScapeRun:
        if self.optimizer in DENSE and self.sparsity != 0.0:
            raise field_error("sparsity", self.sparsity,
                              f"must be 0 for the dense optimizer {self.optimizer!r}")
        if self.optimizer != "scape" and self.mask_rule != "ef_momentum":
            raise field_error("mask_rule", self.mask_rule,
                              f"applies to optimizer 'scape' only (this run is "
                              f"{self.optimizer!r})")
        if self.optimizer != "scape" and self.decay_scope != "all":
            raise field_error("decay_scope", self.decay_scope,
                              f"applies to optimizer 'scape' only (this run is "
                              f"{self.optimizer!r})")
        if self.optimizer not in SPARSE_OPTIMIZERS and (self.off_mask_momentum is not None
                                                        or self.dense_steps is not None):
            bad = "off_mask_momentum" if self.off_mask_momentum is not None else "dense_steps"
            raise field_error(bad, getattr(self, bad), f"applies to the sparse optimizers "
                              f"{SPARSE_OPTIMIZERS} only (this run is {self.optimizer!r})")
        if self.off_mask_momentum == "decay" and self.optimizer == "scape" and (
                self.mask_rule != "ef_momentum" or self.decay_scope != "all"):
            raise field_error("off_mask_momentum", "decay", "needs mask_rule 'ef_momentum' and "
                              f"decay_scope 'all' (got {self.mask_rule!r}, "
                              f"{self.decay_scope!r})")
        if self.optimizer != "topk" and self.topk_inner != "adams":
            raise field_error("topk_inner", self.topk_inner,
                              f"applies to optimizer 'topk' only (this run is "
                              f"{self.optimizer!r})")
        return self

    @property
    def method(self) -> Method:
        """The run's role in the analysis (:class:`lmrepro.scape.roles.ScapeMethod`)."""
        if self.optimizer == "scape":
            return Method.SCAPE if self.mask_rule == "ef_momentum" else Method.SCAPE_STALE_M
        if self.optimizer == "topk":
            return Method.TOPK if self.topk_inner == "adams" else Method.TOPK_ADAMW
        return Method(self.optimizer)

    @property
    def run_name(self) -> str:
        if self.name:
            return self.name
        if self.optimizer in DENSE:
            return self.optimizer
        tag = {Method.SCAPE: "scape", Method.SCAPE_STALE_M: "scape_stale_m",
               Method.TOPK: "topk", Method.TOPK_ADAMW: "topk_adamw"}[self.method]
        return f"{tag}{round(self.sparsity * 100):g}"

    def lr_or(self, default: float) -> float:
        return default if self.lr is None else self.lr

    def dense_steps_or(self, default: int) -> int:
        return default if self.dense_steps is None else self.dense_steps

    @property
    def momentum_rule(self) -> str:
        """What the run's first moment does off the mask (the method's own unless set)."""
        if self.off_mask_momentum is not None:
            return self.off_mask_momentum
        return "zero" if self.optimizer == "scape" else "decay"


class ScapeSweep(Section):
    """The learning-rate sweep (:mod:`lmrepro.scape.train.sweep`): every run of the suite at every
    ``lrs`` value, shorter, on a seed the suite does not use; the best value per run is the one
    with the lowest final validation loss (a diverged run never wins)."""

    key: ClassVar[str] = "scape.sweep"

    lrs: list[float] = Field(min_length=4, description="peak learning rates, log-spaced")
    steps: int = Field(ge=1, description="optimizer steps of each sweep run")
    seed: int = Field(default=1000, description="the sweep's seed (not one of the suite's)")
    apply: bool = Field(default=True, description="run the suite at the lr each run won "
                        "(false: the suite keeps its own lrs)")

    @model_validator(mode="after")
    def _grid(self) -> ScapeSweep:
        lrs = self.lrs
        if any(not (0.0 < x <= 1.0) for x in lrs) or sorted(set(lrs)) != lrs:
            raise field_error("lrs", lrs, "must be distinct values in (0, 1], increasing")
        ratios = [b / a for a, b in zip(lrs, lrs[1:])]
        if max(ratios) / min(ratios) > 1.01:
            raise field_error("lrs", lrs, "must be log-spaced (a constant ratio between "
                              f"neighbours; got ratios {[round(r, 3) for r in ratios]})")
        return self

    @property
    def ratio(self) -> float:
        return self.lrs[1] / self.lrs[0]

    def on_edge(self, lr: float) -> bool:
        """Whether ``lr`` is the grid's smallest or largest value (the optimum may lie beyond)."""
        return math.isclose(lr, self.lrs[0]) or math.isclose(lr, self.lrs[-1])


class ScalingAblation(Section):
    """One named variant of a run of the study, at the verdict point."""

    key: ClassVar[str] = "scape.scaling.ablations[]"

    name: str = Field(min_length=1, description="the ablation's run name")
    run: str = Field(description="the study run it varies (by run name)")
    weight_decay: float | None = Field(default=None, ge=0.0, description="weight decay instead "
                                       "of the suite's")
    decay_scope: Literal["all", "mask"] | None = Field(default=None, description="SCAPE's "
                                                       "decay scope instead of 'all'")
    renamed: ClassVar[dict[str, str]] = {
        "density_warmup_fraction": "use sparsity_warmup_fraction (the same fraction)"}

    sparsity_warmup_fraction: float | None = Field(default=None, ge=0.0, lt=1.0,
                                                   description="sparsity warm-up, as a fraction "
                                                   "of the run, instead of the study's")


class ScalingContrast(Section):
    """Two runs of the verdict point compared on the same seeds (test split): a mechanism
    ablation against the run it varies, or two methods at different bytes."""

    key: ClassVar[str] = "scape.scaling.contrasts[]"

    candidate: str = Field(min_length=1, description="the run judged (by run name)")
    baseline: str = Field(min_length=1, description="the run it is judged against")
    isolates: str = Field(default="", description="what the two runs differ in, in words")


class BranchStudy(Section):
    """The ``scape.scaling.branches`` section: decay branches from the stable phase of the
    verdict point's runs (:mod:`lmrepro.scape.study.branches`), so each has a curve of final
    loss against training length."""

    key: ClassVar[str] = "scape.scaling.branches"

    runs: list[str] = Field(min_length=1, description="the verdict size's runs that branch "
                            "(each from its verdict-seed runs)")
    first_fraction: float = Field(default=0.1, gt=0.0, lt=1.0, description="the first branch "
                                  "point, a fraction of the verdict length (after the warm-ups)")
    points: int = Field(default=7, ge=2, description="branch points, log-spaced from the first "
                        "to the start of the stable run's decay")


class ScalingStudy(Section):
    """The ``scape.scaling`` section (see the module docstring)."""

    key: ClassVar[str] = "scape.scaling"
    renamed: ClassVar[dict[str, str]] = {
        "density_warmup_fraction": "use sparsity_warmup_fraction (the same fraction)"}

    sizes: dict[str, ModelConfig] = Field(min_length=1, description="model sizes by name")
    lengths: dict[str, list[int]] = Field(description="training lengths (optimizer steps) per "
                                          "size, increasing")
    runs: dict[str, list[ScapeRun]] = Field(description="the methods per size (each at its lr)")
    seeds: dict[str, list[int]] = Field(description="seeds of every point, per size")
    verdict_size: str = Field(description="the size whose longest length takes the verdict")
    verdict_seeds: list[int] = Field(min_length=1, description="seeds of the verdict point")
    warmup_fraction: float = Field(default=0.05, ge=0.0, lt=1.0, description="lr warm-up as a "
                                   "fraction of the run")
    sparsity_warmup_fraction: float = Field(default=0.10, ge=0.0, lt=1.0, description="the "
                                            "sparse methods' sparsity warm-up, a fraction of "
                                            "the run")
    sweep_factors: list[float] = Field(default_factory=list, description="lr sweep at the "
                                       "verdict point: these multiples of each run's lr (empty: "
                                       "no sweep)")
    sweep_seed: int = Field(default=1000, ge=0, description="the sweep's seed (not a study seed)")
    sweep_runs: list[str] = Field(default_factory=list, description="the verdict size's runs "
                                  "the sweep brackets (empty: every run); the others keep the "
                                  "lr the profile gives them (say where it was tuned)")
    contrasts: list[ScalingContrast] = Field(default_factory=list, description="pairs of "
                                             "verdict-point runs compared on the same seeds")
    ablations: list[ScalingAblation] = Field(default_factory=list)
    ablation_seeds: list[int] = Field(default_factory=list)
    edge_check: bool = Field(default=True, description="last: train each sweep winner on the "
                             "grid's edge one grid step beyond it (reported, not applied)")
    curve_points: int = Field(default=0, ge=0, description="validation and test losses at this "
                              "many log-spaced step counts along each run, from 1 % of it to "
                              "the start of its lr decay (wsd) or its end (steps-to-target; "
                              "0: the final model only)")
    branches: BranchStudy | None = Field(default=None, description="decay branches from the "
                                         "verdict point's stable phase (wsd); null: none")
    reuse_sweep_seed: bool = Field(default=False, description="the sweep's seed is a verdict "
                                   "seed: that seed's verdict runs are the sweep's winners "
                                   "(tuned on the validation split, judged on the test split) "
                                   "instead of a fourth training")

    @model_validator(mode="after")
    def _consistent(self) -> ScalingStudy:
        from lmrepro.pipeline.study_section import check_points, check_sweep_factors, study_seeds

        check_points(self, ("lengths", "runs", "seeds"))
        names = {r.run_name for r in self.runs[self.verdict_size]}
        for i, ab in enumerate(self.ablations):
            if ab.run not in names:
                raise field_error(f"ablations[{i}].run", ab.run,
                                  f"must be a run of the verdict size: {sorted(names)}")
            if ab.name in names:
                raise field_error(f"ablations[{i}].name", ab.name, "must differ from the runs'")
        for where, listed in (("sweep_runs", self.sweep_runs),
                              ("branches.runs", self.branches.runs if self.branches else []),
                              *((f"contrasts[{i}]", [c.candidate, c.baseline])
                                for i, c in enumerate(self.contrasts))):
            if not set(listed) <= names:
                raise field_error(where, listed,
                                  f"must name runs of the verdict size: {sorted(names)}")
        if self.ablations and not self.ablation_seeds:
            raise field_error("ablation_seeds", self.ablation_seeds, "must list seeds when "
                              "there are ablations")
        check_sweep_factors(self)
        used = study_seeds(self)
        if self.reuse_sweep_seed and self.sweep_seed not in self.verdict_seeds:
            raise field_error("sweep_seed", self.sweep_seed, "must be one of verdict_seeds "
                              f"{self.verdict_seeds} with reuse_sweep_seed")
        if not self.reuse_sweep_seed and self.sweep_seed in used:
            raise field_error("sweep_seed", self.sweep_seed, "must not be a study seed (or set "
                              "reuse_sweep_seed)")
        return self

    @property
    def verdict_steps(self) -> int:
        return self.lengths[self.verdict_size][-1]


class WorkersStudy(Section):
    """The ``scape.workers`` section: the worker-count study (:mod:`lmrepro.scape.study.workers`).
    Every run at every worker count W trains ``steps`` steps of ``model`` on a global batch of
    ``global_batch`` sequences (each worker ``global_batch / W``), with W workers simulated in
    one process (:mod:`lmrepro.scape.train.simulated`)."""

    key: ClassVar[str] = "scape.workers"

    model: ModelConfig = Field(description="the model every run trains")
    steps: int = Field(ge=1, description="optimizer steps of every run")
    global_batch: int = Field(ge=1, description="sequences per step over all workers")
    workers: list[int] = Field(min_length=1, description="worker counts W, increasing")
    runs: list[ScapeRun] = Field(min_length=1, description="the methods, each at its centre lr")
    seeds: list[int] = Field(min_length=1, description="verdict seeds (test split)")
    warmup_fraction: float = Field(default=0.05, ge=0.0, lt=1.0, description="lr warm-up, a "
                                   "fraction of the run")
    sparsity_warmup_fraction: float = Field(default=0.10, ge=0.0, lt=1.0, description="the "
                                            "sparse methods' sparsity warm-up, a fraction")
    sweep_workers: list[int] = Field(min_length=1, description="the worker counts at which "
                                     "every run's lr is bracketed; another W takes the winner "
                                     "of the nearest of them (in log W, the smaller on a tie)")
    sweep_factors: list[float] = Field(min_length=3, description="multiples of each run's "
                                       "centre lr tried, increasing")
    sweep_seed: int = Field(default=1000, ge=0, description="the sweep's held-out seed")
    max_extensions: int = Field(default=2, ge=0, description="a winner on the grid's edge is "
                                "extended one grid step further, at most this many times, "
                                "before any verdict run")
    probe_every: int = Field(default=10, ge=0, description="SCAPE's mask-agreement probe "
                             "every this many steps (0: none)")
    parallel: int = Field(default=2, ge=1, description="runs trained at once (one process "
                          "each)")

    @model_validator(mode="after")
    def _consistent(self) -> WorkersStudy:
        if sorted(set(self.workers)) != self.workers or self.workers[0] < 1:
            raise field_error("workers", self.workers, "must be distinct counts >= 1, "
                              "increasing")
        for w in self.workers:
            if self.global_batch % w:
                raise field_error("workers", self.workers, f"must divide global_batch = "
                                  f"{self.global_batch} (W = {w} does not)")
        if not set(self.sweep_workers) <= set(self.workers):
            raise field_error("sweep_workers", self.sweep_workers,
                              f"must be among workers {self.workers}")
        f = self.sweep_factors
        if sorted(set(f)) != f or f[0] <= 0 or 1.0 not in f:
            raise field_error("sweep_factors", f, "must be distinct positive multiples, "
                              "increasing, 1.0 among them")
        if self.sweep_seed in self.seeds:
            raise field_error("sweep_seed", self.sweep_seed, f"must be held out: not one of "
                              f"the verdict seeds {self.seeds}")
        names = [r.run_name for r in self.runs]
        if len(set(names)) != len(names):
            raise field_error("runs", names, "run names must be unique")
        return self


class ScapeSuite(ScapeConfig):
    """The ``scape:`` section: shared settings, where and how many workers, the runs and the
    optional learning-rate sweep."""

    corpus: str = Field(description="prepared corpus every run trains on")
    world_size: int = Field(default=2, ge=1, description="torchrun workers on this machine")
    model: ModelConfig | None = Field(default=None, description="default: the top-level model")
    runs: list[ScapeRun] = Field(min_length=1)
    sweep: ScapeSweep | None = Field(default=None, description="learning-rate sweep run before "
                                     "the suite (null: none; the runs' lrs are used)")
    scaling: ScalingStudy | None = Field(default=None, description="the training-length study "
                                         "(lmrepro.scape.study.scaling; null: none in this "
                                         "profile)")
    workers: WorkersStudy | None = Field(default=None, description="the worker-count study "
                                         "(lmrepro.scape.study.workers; null: none)")

    @model_validator(mode="after")
    def _unique_names(self) -> ScapeSuite:
        names = [r.run_name for r in self.runs]
        if len(set(names)) != len(names):
            raise field_error("runs", names, "run names must be unique")
        return self

    @property
    def settings(self) -> ScapeConfig:
        """The shared settings alone (what each worker receives)."""
        return ScapeConfig(**{k: getattr(self, k) for k in ScapeConfig.model_fields})
