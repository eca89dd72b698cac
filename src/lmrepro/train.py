"""Single-process training with global backprop: the baseline every method is compared with.

AdamW (decoupled weight decay, Loshchilov & Hutter 2019), linear warm-up then cosine decay, global
gradient-norm clipping, periodic evaluation in bits per byte on the fixed evaluation batches, and
per-batch evaluation losses of the final model saved for the paired statistics.

Resumable: every ``checkpoint_every`` steps the model, the optimizer, the batch generator's state
and the step are written atomically to ``out_dir/checkpoint.pt``. A run started again with the
same arguments continues from there; ``metrics.jsonl`` is cut back to the checkpointed step, so a
run killed at any point and resumed ends with the same parameters and metrics, bit for bit on
CPU, as one that was never interrupted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from lmrepro.data.batches import check_context, sample_batch
from lmrepro.errors import check
from lmrepro.evaluation import bits_per_byte, cosine_lr, evaluate_losses
from lmrepro.io import append_jsonl, atomic_torch_save, read_jsonl, torch_load
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.results import METRICS, peak_rss_bytes, write_eval_losses, write_summary

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
#: AdamW implementations of torch: ``loop`` (one kernel chain per tensor, torch's CPU default),
#: ``foreach`` (multi-tensor kernels) and ``fused`` (one fused kernel).
OPTIMIZER_IMPLS = ("loop", "foreach", "fused")


@dataclass(frozen=True)
class TrainSettings:
    """Hyper-parameters of one single-process run (see ``train:`` in params.yaml)."""

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    eval_batch_size: int = 16
    checkpoint_every: int = 100
    log_every: int = 10
    threads: int = 1
    seed: int = 0
    #: torch AdamW kernels: "loop" | "foreach" | "fused" (see :func:`make_optimizer`).
    optimizer_impl: str = "fused"
    #: ``torch.compile`` the forward pass; off: measured no faster on the default model on CPU,
    #: and a cold compile costs about 35 s (``bench/bench_cpu.py``).
    compile: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_batches", "eval_batch_size",
                     "checkpoint_every", "log_every", "threads"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, f"train.{name}", value,
                  "must be an integer >= 1")
        check(self.lr > 0, "train.lr", self.lr, "must be > 0")
        check(self.warmup_steps >= 0, "train.warmup_steps", self.warmup_steps, "must be >= 0")
        check(self.optimizer_impl in OPTIMIZER_IMPLS, "train.optimizer_impl",
              self.optimizer_impl, f"must be one of {list(OPTIMIZER_IMPLS)}")
        check(isinstance(self.compile, bool), "train.compile", self.compile,
              "must be true or false")


def make_optimizer(model: torch.nn.Module, s: TrainSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms or embeddings' rows).

    ``s.optimizer_impl`` picks torch's implementation (:data:`OPTIMIZER_IMPLS`); the update rule
    is the same, the kernels differ (``bench/bench_cpu.py`` measures them side by side). ``loop``
    (torch's CPU default) and ``foreach`` give bit-identical parameters; ``fused`` (the default,
    measured fastest: its optimizer phase is about 2 ms against 7 ms per step of the default
    model) rounds differently, about 1e-5 apart after 20 steps."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": s.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    impl = s.optimizer_impl
    kw = {"foreach": impl == "foreach"} if impl != "fused" else {"fused": True}
    return torch.optim.AdamW(groups, lr=s.lr, betas=(s.beta1, s.beta2), **kw)


def compiled_forward(model: torch.nn.Module, s: TrainSettings) -> torch.nn.Module:
    """The module used for training forward passes: ``torch.compile(model)`` when
    ``s.compile`` (parameters stay shared with ``model``), else ``model`` itself."""
    return torch.compile(model) if s.compile else model


def train_step(forward: torch.nn.Module, model: torch.nn.Module, opt: torch.optim.Optimizer,
               x: torch.Tensor, y: torch.Tensor, grad_clip: float) -> float:
    """One optimisation step of global backprop; returns the loss (nats). ``forward`` is the
    (possibly compiled) module, ``model`` the plain one whose parameters are clipped."""
    loss = lm_loss(forward(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss.item()


def run_fingerprint(*parts: dict) -> str:
    """A stable digest of a run's configuration: a checkpoint resumes only the same run."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _save_checkpoint(out_dir: Path, step: int, model: torch.nn.Module,
                     opt: torch.optim.Optimizer, gen: torch.Generator, elapsed: float,
                     fingerprint: str) -> None:
    atomic_torch_save({
        "step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
        "generator": gen.get_state(), "elapsed_s": elapsed, "fingerprint": fingerprint,
    }, out_dir / CHECKPOINT)


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep only records of steps already covered by the checkpoint (resume rewrites the rest)."""
    from lmrepro.io import atomic_write_text
    import json

    kept = [r for r in read_jsonl(path) if r.get("step", -1) < step]
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


def train_single(model_cfg: ModelConfig, settings: TrainSettings, train_data: np.ndarray,
                 val_data: np.ndarray, out_dir: str | Path, *, corpus: str = "",
                 name: str = "backprop", progress: bool = True) -> dict:
    """Train one model with global backprop; write the run directory; return its summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_context(len(train_data), model_cfg.context, "model.context")
    check_context(len(val_data), model_cfg.context, "model.context")
    torch.set_num_threads(settings.threads)

    torch.manual_seed(settings.seed)
    model = ByteTransformer(model_cfg)
    opt = make_optimizer(model, settings)
    forward = compiled_forward(model, settings)
    gen = torch.Generator().manual_seed(settings.seed)
    start, elapsed = 0, 0.0
    metrics_path = out_dir / METRICS
    fingerprint = run_fingerprint(model_cfg.to_dict(), asdict(settings), name, corpus,
                                  len(train_data), len(val_data))
    ckpt = torch_load(out_dir / CHECKPOINT) if (out_dir / CHECKPOINT).exists() else None
    if ckpt is not None and ckpt.get("fingerprint") != fingerprint:
        log.warning("%s holds a checkpoint of a different configuration; starting afresh",
                    out_dir / CHECKPOINT)
        ckpt = None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["generator"])
        start, elapsed = int(ckpt["step"]), float(ckpt["elapsed_s"])
        log.info("resuming %s from step %d (%s)", name, start, out_dir / CHECKPOINT)
    _truncate_metrics(metrics_path, start)

    log.info("training %s: %d params, %d steps -> %s", name, model.num_parameters(),
             settings.steps, out_dir)
    tokens_per_step = settings.batch_size * model_cfg.context
    bar = tqdm(range(start, settings.steps), initial=start, total=settings.steps,
               desc=f"train {name}", disable=not progress)
    model.train()
    for step in bar:
        t0 = time.perf_counter()
        lr = cosine_lr(step, settings.steps, settings.warmup_steps, settings.lr,
                       settings.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sample_batch(train_data, settings.batch_size, model_cfg.context, gen)
        loss_value = train_step(forward, model, opt, x, y, settings.grad_clip)
        dt = time.perf_counter() - t0
        elapsed += dt
        done = step + 1
        if step % settings.log_every == 0 or done == settings.steps:
            append_jsonl(metrics_path, {"step": step, "loss": loss_value, "lr": lr,
                                        "step_time_s": dt})
            bar.set_postfix(loss=f"{loss_value:.3f}")
        if done % settings.eval_every == 0 and done != settings.steps:
            model.eval()
            bpb = bits_per_byte(evaluate_losses(model, val_data, model_cfg.context,
                                                settings.eval_batch_size, settings.eval_batches))
            model.train()
            append_jsonl(metrics_path, {"step": step, "eval_bpb": bpb})
        if done % settings.checkpoint_every == 0 or done == settings.steps:
            _save_checkpoint(out_dir, done, model, opt, gen, elapsed, fingerprint)

    model.eval()
    losses = evaluate_losses(model, val_data, model_cfg.context, settings.eval_batch_size,
                             settings.eval_batches)
    final_bpb = bits_per_byte(losses)
    append_jsonl(metrics_path, {"step": settings.steps - 1, "eval_bpb": final_bpb})
    write_eval_losses(out_dir, losses, settings.eval_batch_size, model_cfg.context)
    summary = {
        "name": name, "method": "backprop-adamw", "corpus": corpus, "steps": settings.steps,
        "tokens": settings.steps * tokens_per_step, "final_bpb": final_bpb,
        "mean_step_time_s": elapsed / settings.steps,
        "tokens_per_s": settings.steps * tokens_per_step / max(elapsed, 1e-12),
        "peak_rss_bytes": peak_rss_bytes(), "seed": settings.seed,
        "threads": settings.threads, "n_params": model.num_parameters(),
        "model": model_cfg.to_dict(), "settings": asdict(settings),
    }
    write_summary(out_dir, summary)
    log.info("%s done: final %.4f bits/byte, %.0f tokens/s -> %s", name, final_bpb,
             summary["tokens_per_s"], out_dir)
    return summary


def load_final_model(out_dir: str | Path, model_cfg: ModelConfig) -> ByteTransformer:
    """The model of a finished run, from its checkpoint (``weights_only`` load)."""
    model = ByteTransformer(model_cfg)
    model.load_state_dict(torch_load(Path(out_dir) / CHECKPOINT)["model"])
    return model.eval()
