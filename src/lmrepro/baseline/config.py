"""Settings of the single-process baseline trainer: the ``train:`` section of ``params.yaml``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from lmrepro.evaluation import TrainingConfig


class BaselineConfig(TrainingConfig):
    """Hyper-parameters of one single-process global-backprop run (:func:`train_single`); it
    checkpoints every ``checkpoint_every`` steps and at the end."""

    key: ClassVar[str] = "train"

    max_grad_norm: float = Field(default=1.0, ge=0.0, description="global-norm clip; 0 disables")
    eval_every: int = Field(default=100, ge=1, description="evaluate every this many steps")
    log_every: int = Field(default=10, ge=1, description="log the training loss every this many "
                           "steps")
    threads: int = Field(default=1, ge=1, description="torch intra-op threads")
    optimizer_impl: Literal["loop", "foreach", "fused"] = Field(
        default="fused", description="torch AdamW kernels; fused measured fastest "
        "(docs/performance.md)")
    compile: bool = Field(default=False, description="torch.compile the forward pass "
                          "(inconclusive gain, 33 s cold compile: docs/performance.md)")


class BaselineSuite(BaselineConfig):
    """The ``train:`` section: the settings, and the corpora to train one run on each."""

    corpora: list[str] = Field(min_length=1, description="prepared corpora, one run each")
