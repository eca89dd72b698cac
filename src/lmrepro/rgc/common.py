"""Pieces shared by the three executors: model and optimizers, data, checkpoints, run records.

The checkpoint format is the same for every executor (a full ``ByteTransformer`` state dict, the
optimizer states by name, the batch generator's state and the step), written with
:func:`lmrepro.io.atomic_torch_save` and read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io as _io
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from lmrepro.errors import ParameterError, check
from lmrepro.evaluation import bits_per_byte, cosine_lr, evaluate_losses
from lmrepro.io import append_jsonl, atomic_torch_save, read_jsonl, torch_load, atomic_write_text
from lmrepro.model import ByteTransformer
from lmrepro.results import METRICS, write_eval_losses, write_summary
from lmrepro.rgc.config import RGCConfig

CHECKPOINT = "checkpoint.pt"
CKPT_FORMAT = "lmrepro-rgc-checkpoint-v1"


def build_model(cfg: RGCConfig) -> ByteTransformer:
    """The model, initialised from ``cfg.seed`` (identical in every process and executor)."""
    torch.manual_seed(cfg.seed)
    return ByteTransformer(cfg.model_config())


def make_adamw(params: Iterable[torch.nn.Parameter], cfg: RGCConfig) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices and embeddings, none on biases and norms."""
    params = list(params)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=False)


def lr_at(cfg: RGCConfig, step: int) -> float:
    return cosine_lr(step, cfg.steps, cfg.warmup_steps, cfg.lr, cfg.min_lr_ratio)


def set_lr(optimizers: Iterable[torch.optim.Optimizer], lr: float) -> None:
    for opt in optimizers:
        for g in opt.param_groups:
            g["lr"] = lr


def batch_generator(cfg: RGCConfig) -> torch.Generator:
    """The training-batch generator (separate from the initialisation RNG)."""
    return torch.Generator().manual_seed(cfg.seed + 1_000_003)


def micro_batches(x: torch.Tensor, y: torch.Tensor, n: int
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(x.chunk(n, dim=0), y.chunk(n, dim=0)))


def synthetic_corpus(n_bytes: int = 200_000, seed: int = 0) -> np.ndarray:
    """Deterministic text-like bytes (words from a small vocabulary) for runs given no data."""
    rng = np.random.default_rng(seed)
    words = [w.encode() for w in (
        "the of and to in is was for on that with as by at from his her it an were are which "
        "this be or has had not but first one their its new after who they have two "
        "river stone garden winter morning letter music light").split()]
    out = bytearray()
    while len(out) < n_bytes:
        sentence = b" ".join(words[i] for i in rng.integers(0, len(words), rng.integers(4, 14)))
        out += sentence[:1].upper() + sentence[1:] + b". "
    return np.frombuffer(bytes(out[:n_bytes]), dtype=np.uint8).copy()


def check_data(name: str, data: Any, context: int) -> np.ndarray:
    check(isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1, name,
          type(data).__name__ if not isinstance(data, np.ndarray) else f"array {data.dtype}"
          f"{list(data.shape)}", "must be a 1-D numpy uint8 array of bytes")
    check(len(data) > context + 1, name, f"{len(data)} bytes",
          f"must hold more than context + 1 = {context + 1} bytes")
    return data


def evaluate(model: ByteTransformer, val: np.ndarray, cfg: RGCConfig) -> list[float]:
    """Per-batch losses (nats) of the last stage's readout ``D(h_K)`` on the fixed eval set.

    The last stage's readout is the model's own forward pass (all blocks, then the decoder)."""
    was = model.training
    model.eval()
    try:
        return evaluate_losses(model, val, cfg.context, cfg.eval_batch_size, cfg.eval_batches)
    finally:
        model.train(was)


# -- checkpoints ---------------------------------------------------------------------------------

def _identity(cfg: RGCConfig, executor: str) -> dict:
    """Config keys a resumed run must share with its checkpoint (all but the eval cadence,
    the checkpoint cadence and the timeout)."""
    d = cfg.to_dict()
    for k in ("eval_interval", "checkpoint_interval", "worker_timeout_s"):
        d.pop(k)
    d["threads_per_stage"] = list(cfg.stage_threads)
    d["executor"] = executor
    return d


def save_checkpoint(out_dir: Path, cfg: RGCConfig, executor: str, step: int,
                    model_state: dict[str, torch.Tensor], optim_states: dict[str, dict],
                    gen_state: torch.Tensor) -> None:
    atomic_torch_save({
        "format": CKPT_FORMAT, "identity": _identity(cfg, executor), "step": int(step),
        "model": model_state, "optims": optim_states, "gen_state": gen_state,
    }, Path(out_dir) / CHECKPOINT)


def load_checkpoint(out_dir: Path | None, cfg: RGCConfig, executor: str) -> dict | None:
    """The run's checkpoint, or ``None``; refuses one written by another configuration."""
    if out_dir is None or not (Path(out_dir) / CHECKPOINT).exists():
        return None
    path = Path(out_dir) / CHECKPOINT
    ck = torch_load(path)
    check(ck.get("format") == CKPT_FORMAT, "checkpoint", str(path),
          f"must be an RGC checkpoint ({CKPT_FORMAT})")
    want = _identity(cfg, executor)
    have = ck["identity"]
    diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if diff:
        raise ParameterError("out_dir", str(out_dir),
                             f"holds a checkpoint of a different run (differs in {diff}: "
                             f"checkpoint {[have.get(k) for k in diff]} vs now "
                             f"{[want.get(k) for k in diff]}); use a fresh out dir")
    return ck


def state_to_bytes(obj: Any) -> bytes:
    buf = _io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> Any:
    return torch.load(_io.BytesIO(data), map_location="cpu", weights_only=True)


# -- run records ---------------------------------------------------------------------------------

@dataclass
class TrainResult:
    """What :func:`lmrepro.rgc.train` returns.

    ``tokens_per_s`` counts training tokens of this invocation over its training wall time
    (start-up, checkpoint writes excluded where possible, final evaluation excluded);
    ``peak_rss_bytes`` is the sampled peak RSS of the whole process tree; ``final_bpb`` the
    last stage's readout in bits per byte on the fixed eval set; ``eval_losses`` per batch, nats.
    """

    executor: str
    tokens_per_s: float
    peak_rss_bytes: int
    final_bpb: float
    eval_losses: list[float]
    summary: dict[str, Any]
    metrics: list[dict] = field(default_factory=list)
    final_state: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    out_dir: Path | None = None


class Recorder:
    """Writes ``metrics.jsonl`` (truncated to the resumed step), ``eval_losses.json`` and
    ``summary.json`` in the layout of :mod:`lmrepro.results`; keeps the records in memory too."""

    def __init__(self, out_dir: Path | None, resume_step: int) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.records: list[dict] = []
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            kept = [r for r in read_jsonl(self.out_dir / METRICS)
                    if r.get("step", math.inf) < resume_step] if resume_step > 0 else []
            atomic_write_text(self.out_dir / METRICS,
                              "".join(json.dumps(r, sort_keys=True) + "\n"
                                      for r in kept))
            self.records = kept

    def log(self, record: dict) -> None:
        self.records.append(record)
        if self.out_dir is not None:
            append_jsonl(self.out_dir / METRICS, record)

    def finish(self, cfg: RGCConfig, summary: dict, eval_losses: list[float]) -> None:
        if self.out_dir is not None:
            write_eval_losses(self.out_dir, eval_losses, cfg.eval_batch_size, cfg.context)
            write_summary(self.out_dir, summary)


def make_summary(cfg: RGCConfig, executor: str, name: str | None, corpus: str,
                 eval_losses: list[float], tokens_per_s: float, peak_rss: int,
                 records: list[dict], start_step: int, train_time_s: float) -> dict:
    step_times = [r["step_time_s"] for r in records if "step_time_s" in r]
    method = "backprop" if executor == "backprop" else "rgc"
    threads: Any = list(cfg.stage_threads) if executor == "async" \
        else cfg.single_process_threads
    return {
        "name": name or (f"rgc-{executor}" if method == "rgc" else "backprop"),
        "method": method, "executor": executor, "corpus": corpus, "steps": cfg.steps,
        "tokens": cfg.steps * cfg.batch_size * cfg.context,
        "final_bpb": bits_per_byte(eval_losses), "tokens_per_s": tokens_per_s,
        "mean_step_time_s": float(np.mean(step_times)) if step_times else float("nan"),
        "peak_rss_bytes": int(peak_rss), "seed": cfg.seed, "threads": threads,
        "total_threads": sum(cfg.stage_threads) if executor == "async"
        else cfg.single_process_threads,
        "n_layers": cfg.n_layers, "n_stages": cfg.n_stages,
        "horizon": cfg.horizon if method == "rgc" else None, "d_model": cfg.d_model,
        "context": cfg.context, "batch_size": cfg.batch_size, "micro_batches": cfg.micro_batches,
        "resumed_from_step": start_step, "train_time_s": train_time_s,
        "config": cfg.to_dict(),
    }


class Clock:
    """Wall time of the training loop, excluding explicitly paused spans (checkpoints, evals)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t: float | None = None

    def start(self) -> None:
        self._t = time.perf_counter()

    def pause(self) -> None:
        if self._t is not None:
            self.total += time.perf_counter() - self._t
            self._t = None
