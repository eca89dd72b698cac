"""Settings of the SCAPE comparison: the ``scape:`` section of ``params.yaml``.

:class:`ScapeConfig` holds what every run of the suite shares (the ``train-scape`` flags of the
same names), :class:`ScapeRun` what one run chooses (optimizer, sparsity, name), and
:class:`ScapeSuite` the section: the shared settings, the corpus, the world size, an optional model
override and the list of runs.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from lmrepro.config import Section, field_error
from lmrepro.evaluation import TrainingConfig
from lmrepro.model import ModelConfig

OPTIMIZERS = ("adamw", "adams", "scape", "topk")
DENSE = ("adamw", "adams")


class ScapeConfig(TrainingConfig):
    """Hyper-parameters shared by every run of the suite (one ``train-scape`` worker each);
    ``batch_size`` is per worker."""

    key: ClassVar[str] = "scape"

    timeout_s: float = Field(default=60.0, gt=0.0, description="process-group timeout: a dead "
                             "or stalled peer fails the run after this")
    threads: int = Field(default=1, ge=1, description="torch threads per worker")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda "
                                                   "when available (NCCL), else cpu (gloo)")
    mask_score: Literal["m_abs", "m_over_sqrt_v"] = Field(default="m_abs",
                                                          description="SCAPE mask score")


#: Settings a resumed run may change (they do not change the numbers).
RESUME_FREE = ("timeout_s", "threads", "device", "checkpoint_every")


class ScapeRun(Section):
    """One run of the suite: which optimizer, at which sparsity."""

    key: ClassVar[str] = "scape.runs[]"

    name: str = Field(default="", description="run name (default: optimizer and sparsity)")
    optimizer: Literal["adamw", "adams", "scape", "topk"] = Field(description="the method")
    sparsity: float = Field(default=0.0, ge=0.0, lt=1.0, description="fraction of coordinates "
                            "not sent per step (0 for the dense optimizers)")

    @model_validator(mode="after")
    def _dense_is_dense(self) -> ScapeRun:
        if self.optimizer in DENSE and self.sparsity != 0.0:
            raise field_error("sparsity", self.sparsity,
                              f"must be 0 for the dense optimizer {self.optimizer!r}")
        return self

    @property
    def run_name(self) -> str:
        if self.name:
            return self.name
        if self.optimizer in DENSE:
            return self.optimizer
        return f"{self.optimizer}{round(self.sparsity * 100):g}"


class ScapeSuite(ScapeConfig):
    """The ``scape:`` section: shared settings, where and how many workers, and the runs."""

    corpus: str = Field(description="prepared corpus every run trains on")
    world_size: int = Field(default=2, ge=1, description="torchrun workers on this machine")
    model: ModelConfig | None = Field(default=None, description="default: the top-level model")
    runs: list[ScapeRun] = Field(min_length=1)

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
