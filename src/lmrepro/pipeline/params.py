"""The typed schema of ``params.yaml`` and its profiles.

``params.yaml`` holds the default profile (2 CPU cores, ``dvc repro`` in about 15 minutes) at its
top level, a ``profile`` key naming the active profile, and a ``profiles`` mapping of named
overrides (``smoke`` for tests, ``paper`` for the papers' scale). The active configuration is the
top level deep-merged with ``profiles[profile]``.

Every stage validates the merged configuration before it does anything: an unknown key, a wrong
type or an out-of-range value stops with the key path, the value and what is allowed, e.g.::

    params.yaml (profile 'default'): train.steps = -3: Input should be greater than 0

Why pydantic: strict, nested, with key paths in its errors; ``extra="forbid"`` turns a typo into
an error instead of a silently ignored setting.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lmrepro.data.spec import DataConfig
from lmrepro.errors import ConfigError, ParameterError
from lmrepro.model import ModelConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class ModelParams(_Strict):
    n_layers: int = Field(ge=1)
    d_model: int = Field(ge=8)
    n_heads: int = Field(ge=1)
    context: int = Field(ge=2)
    mlp_ratio: int = Field(default=4, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    tie_embeddings: bool = False

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelParams":
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads = {self.n_heads} must divide d_model = {self.d_model}")
        return self

    def config(self) -> ModelConfig:
        return ModelConfig(**self.model_dump())


class OptimParams(_Strict):
    lr: float = Field(gt=0.0, le=1.0)
    warmup_steps: int = Field(ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    weight_decay: float = Field(default=0.1, ge=0.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    grad_clip: float = Field(default=1.0, ge=0.0, description="0 disables clipping")


class TrainParams(OptimParams):
    """Single-process global-backprop training (the baseline trainer)."""

    corpora: list[str] = Field(min_length=1)
    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    eval_every: int = Field(ge=1)
    eval_batches: int = Field(ge=1)
    eval_batch_size: int = Field(ge=1)
    checkpoint_every: int = Field(ge=1)
    log_every: int = Field(default=10, ge=1)
    threads: int = Field(ge=1)
    optimizer_impl: Literal["loop", "foreach", "fused"] = Field(
        default="fused", description="torch AdamW kernels; fused measured fastest (docs/performance.md)")
    compile: bool = Field(default=False, description="torch.compile the forward pass")


class ScapeRun(_Strict):
    name: str = Field(min_length=1)
    optimizer: Literal["adamw", "adams", "scape", "topk"]
    sparsity: float = Field(default=0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _dense_is_dense(self) -> "ScapeRun":
        if self.optimizer in ("adamw", "adams") and self.sparsity != 0.0:
            raise ValueError(f"sparsity = {self.sparsity} must be 0 for the dense optimizer "
                             f"{self.optimizer!r}")
        return self


class ScapeParams(_Strict):
    """The SCAPE comparison (``train-scape`` under torchrun; see docs/scape.md).

    Every key but ``world_size`` and ``runs`` is the ``train-scape`` option of the same name.
    """

    corpus: str
    world_size: int = Field(default=2, ge=1)
    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1, description="per worker")
    lr: float = Field(gt=0.0, le=1.0)
    warmup: int = Field(ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0)
    eval_batches: int = Field(ge=1)
    eval_batch_size: int = Field(ge=1)
    checkpoint_every: int = Field(default=50, ge=0, description="0 disables checkpoints")
    timeout_s: float = Field(default=60.0, gt=0.0)
    threads: int = Field(default=1, ge=1, description="per worker")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    mask_score: Literal["m_abs", "m_over_sqrt_v"] = "m_abs"
    model: ModelParams | None = Field(default=None, description="default: the top-level model")
    runs: list[ScapeRun] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> "ScapeParams":
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise ValueError(f"run names {names} must be unique")
        return self


class RGCParams(_Strict):
    """The RGC comparison: async RGC, sync RGC and global backprop per corpus (docs/rgc.md).

    Every key but ``corpora`` and ``executors`` is the :class:`lmrepro.rgc.RGCConfig` field of
    the same name (which checks the cross-field rules: stages divide layers, horizon range,
    micro-batches divide the batch, one thread count per stage).
    """

    corpora: list[str] = Field(min_length=1)
    executors: list[Literal["async", "sync", "backprop"]] = Field(min_length=1)
    n_layers: int = Field(ge=1)
    n_stages: int = Field(ge=1)
    horizon: int = Field(default=1, ge=1)
    d_model: int = Field(ge=8)
    n_heads: int = Field(ge=1)
    context: int = Field(ge=2)
    mlp_ratio: int = Field(default=4, ge=1)
    lr: float = Field(gt=0.0, le=1.0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    warmup_steps: int = Field(ge=0)
    weight_decay: float = Field(default=0.1, ge=0.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0)
    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    micro_batches: int = Field(default=4, ge=1)
    threads_per_stage: list[int] | None = None
    backprop_threads: int | None = Field(default=None, ge=1)
    queue_size: int = Field(default=2, ge=1)
    eval_batch_size: int = Field(ge=1)
    eval_batches: int = Field(ge=1)
    eval_interval: int = Field(default=0, ge=0)
    checkpoint_interval: int = Field(default=50, ge=0)
    worker_timeout_s: float = Field(default=300.0, gt=0.0)

    def config(self, seed: int):  # -> lmrepro.rgc.RGCConfig
        from lmrepro.rgc import RGCConfig

        fields = self.model_dump(exclude={"corpora", "executors"})
        if fields["threads_per_stage"] is not None:
            fields["threads_per_stage"] = tuple(fields["threads_per_stage"])
        return RGCConfig(seed=seed, **fields)


class StatsParams(_Strict):
    margin: float = Field(default=0.01, gt=0.0, lt=1.0)
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    n_resamples: int = Field(default=10000, ge=100)
    seed: int = 0


class Params(_Strict):
    """The whole validated configuration of one profile."""

    profile: str
    seed: int = Field(ge=0)
    data: DataConfig
    model: ModelParams
    train: TrainParams
    scape: ScapeParams
    rgc: RGCParams
    stats: StatsParams = StatsParams()

    @model_validator(mode="after")
    def _corpora_prepared(self) -> "Params":
        used = [(f"train.corpora[{i}]", c) for i, c in enumerate(self.train.corpora)]
        used += [(f"rgc.corpora[{i}]", c) for i, c in enumerate(self.rgc.corpora)]
        used.append(("scape.corpus", self.scape.corpus))
        for key, name in used:
            if name not in self.data.use:
                raise ValueError(f"{key} = {name!r} is not prepared by this profile "
                                 f"(data.use = {self.data.use})")
        return self


def deep_merge(base: dict, override: dict) -> dict:
    """``base`` with ``override`` merged in; nested dicts merge, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_profile(raw: dict, profile: str | None = None) -> dict:
    """The top level of ``raw`` merged with the named profile's overrides."""
    raw = dict(raw)
    profiles = raw.pop("profiles", {}) or {}
    name = profile or raw.get("profile", "default")
    if name != "default":
        if name not in profiles:
            raise ParameterError("profile", name,
                                 f"must be 'default' or one of {sorted(profiles)}")
        raw = deep_merge(raw, profiles[name])
    raw["profile"] = name
    return raw


def _format_errors(err: ValidationError, where: str) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<top>"
        value = e.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"{where}: {path} = {shown}: {e['msg']}")
    return "\n".join(lines)


def load_params(path: str | Path = "params.yaml", profile: str | None = None) -> Params:
    """Read, merge and validate ``params.yaml``; raise :class:`ParameterError` on bad input."""
    path = Path(path)
    if not path.exists():
        raise ParameterError("params_file", str(path), "must be an existing YAML file")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ParameterError("params_file", str(path), "must hold a YAML mapping at top level")
    merged = resolve_profile(raw, profile)
    where = f"{path} (profile {merged['profile']!r})"
    try:
        params = Params.model_validate(merged)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ConfigError(key, first.get("input"), _format_errors(err, where)) from None
    _validate_sections(params, where)
    return params


def _validate_sections(params: Params, where: str) -> None:
    """Sections owned by other domains validate with their own schema (see those modules)."""
    try:
        params.rgc.config(params.seed)
    except ParameterError as err:
        raise ConfigError(err.name, err.value, f"{where}: {err}") from None
