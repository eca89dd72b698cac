"""Settings of the single-process baseline trainer: the ``train:`` section of ``params.yaml``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from lmrepro.config import Section


class BaselineConfig(Section):
    """Hyper-parameters of one single-process global-backprop run (:func:`train_single`)."""

    key: ClassVar[str] = "train"

    steps: int = Field(ge=1, description="optimizer steps")
    batch_size: int = Field(ge=1, description="sequences per step")
    lr: float = Field(gt=0.0, le=1.0, description="peak learning rate")
    warmup_steps: int = Field(ge=0, description="linear warm-up steps")
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0,
                                description="final lr / peak lr of the cosine decay")
    weight_decay: float = Field(default=0.1, ge=0.0,
                                description="decoupled weight decay on matrices")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    grad_clip: float = Field(default=1.0, ge=0.0, description="global-norm clip; 0 disables")
    eval_every: int = Field(default=100, ge=1, description="evaluate every this many steps")
    eval_batches: int = Field(default=8, ge=1, description="fixed evaluation batches")
    eval_batch_size: int = Field(default=16, ge=1)
    checkpoint_every: int = Field(default=100, ge=1, description="checkpoint every this many "
                                  "steps (and at the end)")
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
