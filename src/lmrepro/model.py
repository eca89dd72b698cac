"""Byte-level decoder-only transformer (vocabulary 256), pre-norm, with stage cut points.

The model is three parts so that RGC can cut it anywhere:

* ``embed(idx)``: token embedding + learned absolute position embedding -> hidden ``h_0``;
* ``blocks[i]``: pre-norm transformer blocks (causal self-attention through
  :func:`torch.nn.functional.scaled_dot_product_attention`, then a GELU MLP);
* ``decoder``: the readout, final LayerNorm + output projection to 256 logits (optionally tied to
  the input embedding).

``forward(idx, return_hidden=True)`` also returns the hidden state after every block, so a caller
can read out from any depth.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field, model_validator

from lmrepro.config import Section, field_error

VOCAB_SIZE = 256


class ModelConfig(Section):
    """Shape of the byte-level transformer (the ``model:`` section of ``params.yaml``)."""

    key: ClassVar[str] = "model"

    n_layers: int = Field(default=4, ge=1, description="number of transformer blocks")
    d_model: int = Field(default=128, ge=8, description="width of the residual stream")
    n_heads: int = Field(default=4, ge=1, description="attention heads; must divide d_model")
    context: int = Field(default=128, ge=2, description="maximum sequence length (learned "
                         "position embeddings)")
    mlp_ratio: int = Field(default=4, ge=1, description="MLP hidden width / d_model")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0,
                           description="dropout probability (0 for the replication: determinism)")
    tie_embeddings: bool = Field(default=False, description="tie the output projection to the "
                                 "input embedding")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise field_error("n_heads", self.n_heads, f"must divide d_model = {self.d_model}")
        return self


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        hidden = cfg.mlp_ratio * cfg.d_model
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, hidden), nn.GELU(), nn.Linear(hidden, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.context = cfg.context
        self.tok = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds model.context = {self.context}")
        pos = torch.arange(t, device=idx.device)
        return self.drop(self.tok(idx) + self.pos(pos))


class Decoder(nn.Module):
    """The readout shared by every stage in RGC: final LayerNorm and the 256-way projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB_SIZE, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(h))


class ByteTransformer(nn.Module):
    """Decoder-only byte-level language model; see the module docstring."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.decoder = Decoder(cfg)
        if cfg.tie_embeddings:
            self.decoder.head.weight = self.embed.tok.weight
        self.apply(self._init_weights)
        # GPT-2 style: scale residual projections by 1/sqrt(2 * n_layers) for stable depth.
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, return_hidden: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits ``(B, T, 256)``; with ``return_hidden`` also the block outputs
        ``[h_1, ..., h_L]``."""
        h = self.embed(idx)
        hidden = []
        for block in self.blocks:
            h = block(h)
            hidden.append(h)
        logits = self.decoder(h)
        return (logits, hidden) if return_hidden else logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy in nats."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_flops_per_token(cfg: ModelConfig) -> float:
    """Approximate training FLOPs per token: 6 x matmul parameters + attention
    (Kaplan et al. 2020)."""
    d, L, t = cfg.d_model, cfg.n_layers, cfg.context
    matmul_params = L * (4 * d * d + 2 * cfg.mlp_ratio * d * d) + d * VOCAB_SIZE
    attn = L * 2 * t * d  # QK^T and AV per token (forward), average context ~ t/2 counted twice
    return 6.0 * matmul_params + 3.0 * attn
