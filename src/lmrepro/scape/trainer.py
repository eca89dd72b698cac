"""The per-worker training loop of ``lmrepro train-scape`` (run under ``torchrun``).

One process per data-parallel rank. Every rank builds the same ``ByteTransformer`` from the same
seed, samples its own batches from a per-rank seeded ``torch.Generator``, calls
``loss.backward()`` then ``opt.step()``; the optimizer (SCAPE, TopKEF, or the dense wrapper
around AdamW / AdamS) does the gradient communication itself. Rank 0 writes the run directory in
the layout of :mod:`lmrepro.results`.

Checkpoints (``--checkpoint-every``) go to ``OUT/checkpoints/step_XXXXXXX/``: ``model.pt`` (rank 0:
the replicated parameters) and ``rank{r}.pt`` (each rank: its optimizer shard state with the
error-feedback residual and the in-flight mask, and its batch generator state), all written
atomically; after a barrier rank 0 points ``OUT/checkpoints/latest.json`` at the new directory,
so a kill at any moment leaves the previous complete checkpoint. A relaunch with the same
arguments resumes from it (``--no-resume`` to forbid) and reproduces the uninterrupted run's
parameters and per-step losses bit for bit on CPU. The final parameters are saved as
``OUT/model_final.pt``. No gradient clipping (for every method alike; see docs/scape.md).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lmrepro.errors import ParameterError, check
from lmrepro.evaluation import bits_per_byte, cosine_lr, evaluate_losses
from lmrepro.io import (append_jsonl, atomic_torch_save, atomic_write_json, atomic_write_text,
                        read_json, read_jsonl, torch_load)
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.optim import MASK_SCORES, SCAPE, AdamS, DenseDP, TopKEF
from lmrepro.results import METRICS, SUMMARY, peak_rss_bytes, write_eval_losses, write_summary
from lmrepro.data.batches import sample_batch
from lmrepro.dist.runtime import (DistContext, DistributedFailure, collective_guard,
                                  init_from_env, report_failure, shutdown)

OPTIMIZERS = ("adamw", "adams", "scape", "topk")
CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
CONFIG = "config.json"
FINAL_MODEL = "model_final.pt"
FAULT_ENV = "LMREPRO_FAULT_KILL_AT"   # "STEP:RANK": that rank SIGKILLs itself before STEP
# Arguments that may differ between the interrupted run and its resumption.
RESUME_FREE = ("resume", "timeout_s", "threads", "device", "checkpoint_every")


@dataclass
class ScapeTrainConfig:
    """Arguments of one distributed run (the ``train-scape`` flags, one to one)."""

    optimizer: str
    corpus_dir: str
    out: str
    sparsity: float = 0.0
    steps: int = 200
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    seed: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    eval_batches: int = 8
    eval_batch_size: int = 8
    checkpoint_every: int = 0
    resume: bool = True
    timeout_s: float = 60.0
    mask_score: str = "m_abs"
    name: str = ""
    corpus: str = ""
    threads: int = 1
    device: str = "auto"

    def validate(self) -> None:
        check(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer,
              f"must be one of {list(OPTIMIZERS)}")
        check(isinstance(self.sparsity, (int, float)) and 0.0 <= self.sparsity < 1.0,
              "sparsity", self.sparsity, "must be in [0, 1)")
        if self.optimizer in ("adamw", "adams"):
            check(self.sparsity == 0.0, "sparsity", self.sparsity,
                  f"must be 0 for the dense optimizer {self.optimizer!r}")
        for key in ("steps", "batch_size", "eval_batches", "eval_batch_size", "threads"):
            v = getattr(self, key)
            check(isinstance(v, int) and v >= 1, key, v, "must be an integer >= 1")
        for key in ("warmup", "checkpoint_every", "seed"):
            v = getattr(self, key)
            check(isinstance(v, int) and v >= 0, key, v, "must be an integer >= 0")
        check(self.lr > 0, "lr", self.lr, "must be > 0")
        check(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", self.min_lr_ratio,
              "must be in [0, 1]")
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0 seconds")
        check(self.mask_score in MASK_SCORES, "mask_score", self.mask_score,
              f"must be one of {sorted(MASK_SCORES)}")
        check(self.device in ("auto", "cpu", "cuda"), "device", self.device,
              "must be 'auto', 'cpu' or 'cuda'")
        check(isinstance(self.model, dict), "model", self.model, "must be a JSON object")
        ModelConfig(**self.model)

    @property
    def run_name(self) -> str:
        if self.name:
            return self.name
        if self.optimizer in ("scape", "topk"):
            return f"{self.optimizer}{round(self.sparsity * 100):g}"
        return self.optimizer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_split_data(corpus_dir: str | os.PathLike, split: str) -> np.ndarray:
    """A prepared split as a uint8 memmap: :func:`lmrepro.data.prepare.load_split` when the
    directory has a manifest, else ``DIR/{split}.bin`` directly."""
    d = Path(corpus_dir)
    if (d / "manifest.json").exists():
        from lmrepro.data.prepare import load_split
        return load_split(d, split)
    path = d / f"{split}.bin"
    if not path.exists():
        raise ParameterError("corpus_dir", str(corpus_dir),
                             f"must be a prepared corpus (manifest.json) or hold {split}.bin; "
                             "run `lmrepro prepare` first")
    return np.memmap(path, dtype=np.uint8, mode="r")


def build_optimizer(cfg: ScapeTrainConfig, model: torch.nn.Module) -> Any:
    """The optimizer for ``cfg.optimizer``; every one exposes ``comm_stats()``."""
    named = list(model.named_parameters())
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "adamw":
        return DenseDP(torch.optim.AdamW([p for _, p in named], lr=cfg.lr, betas=betas,
                                         eps=cfg.eps, weight_decay=cfg.weight_decay,
                                         foreach=False))
    if cfg.optimizer == "adams":
        return DenseDP(AdamS([p for _, p in named], lr=cfg.lr, betas=betas, eps=cfg.eps,
                             weight_decay=cfg.weight_decay))
    if cfg.optimizer == "scape":
        return SCAPE(named, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                     sparsity=cfg.sparsity, mask_score=cfg.mask_score)
    return TopKEF(named, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                  sparsity=cfg.sparsity)


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def latest_checkpoint(out: Path) -> tuple[int, Path] | None:
    """``(step, directory)`` of the last complete checkpoint, or None."""
    path = out / CHECKPOINTS / LATEST
    if not path.exists():
        return None
    info = read_json(path)
    return int(info["step"]), out / CHECKPOINTS / info["dir"]


def save_checkpoint(ctx: DistContext, out: Path, step: int, model: torch.nn.Module, opt: Any,
                    gen: torch.Generator) -> None:
    """Write this rank's files, barrier, then rank 0 publishes ``latest.json`` (see module doc)."""
    name = f"step_{step:07d}"
    d = out / CHECKPOINTS / name
    if ctx.is_main:
        atomic_torch_save({"step": step, "model": model.state_dict()}, d / "model.pt")
    atomic_torch_save({"step": step, "rank": ctx.rank, "world_size": ctx.world_size,
                       "optimizer": opt.state_dict(), "generator": gen.get_state()},
                      d / f"rank{ctx.rank}.pt")
    if ctx.initialized:
        with collective_guard(ctx, f"checkpoint barrier at step {step}"):
            dist.barrier()
    if ctx.is_main:
        atomic_write_json(out / CHECKPOINTS / LATEST, {"step": step, "dir": name,
                                                       "world_size": ctx.world_size})
        for old in (out / CHECKPOINTS).glob("step_*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(ctx: DistContext, ckpt_dir: Path, step: int, model: torch.nn.Module,
                    opt: Any, gen: torch.Generator) -> None:
    model_state = torch_load(ckpt_dir / "model.pt")
    rank_path = ckpt_dir / f"rank{ctx.rank}.pt"
    if not rank_path.exists():
        raise ParameterError("resume checkpoint", str(ckpt_dir),
                             f"has no {rank_path.name}: it was written with another world size")
    mine = torch_load(rank_path)
    check(model_state["step"] == step and mine["step"] == step, "resume checkpoint",
          str(ckpt_dir), f"files disagree on the step (expected {step})")
    check(mine["world_size"] == ctx.world_size, "world size", ctx.world_size,
          f"must equal the checkpoint's {mine['world_size']} to resume")
    with torch.no_grad():
        model.load_state_dict(model_state["model"])
    opt.load_state_dict(mine["optimizer"])
    gen.set_state(mine["generator"])


def _check_resumable(out: Path, cfg: ScapeTrainConfig, world_size: int) -> None:
    path = out / CONFIG
    if not path.exists():
        return
    saved = read_json(path)
    now = dict(cfg.to_dict(), world_size=world_size)
    for key, value in now.items():
        if key in RESUME_FREE:
            continue
        if key in saved and saved[key] != value:
            raise ParameterError(key, value, f"must equal {saved[key]!r} to resume the run in "
                                 f"{out} (or use a fresh --out)")


def _truncate_metrics(out: Path, start_step: int) -> None:
    records = [r for r in read_jsonl(out / METRICS)
               if "eval_bpb" not in r and r.get("step", -1) < start_step]
    atomic_write_text(out / METRICS, "".join(json.dumps(r, sort_keys=True) + "\n"
                                             for r in records))


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------
def _fault_step(rank: int) -> int | None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    step_s, rank_s = spec.split(":")
    return int(step_s) if int(rank_s) == rank else None


def train(cfg: ScapeTrainConfig) -> Path:
    """Run (or resume, or skip if finished) one distributed training run; returns the run dir."""
    cfg.validate()
    ctx = init_from_env(cfg.timeout_s, cfg.device)
    try:
        return _train(cfg, ctx)
    except DistributedFailure as exc:
        report_failure(ctx, exc)
        raise
    finally:
        shutdown(ctx)


def _train(cfg: ScapeTrainConfig, ctx: DistContext) -> Path:
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    if (out / SUMMARY).exists():
        if ctx.is_main:
            print(f"{out / SUMMARY} exists: run already finished, nothing to do", flush=True)
        return out
    train_data = load_split_data(cfg.corpus_dir, "train")
    mcfg = ModelConfig(**cfg.model)
    torch.manual_seed(cfg.seed)
    model = ByteTransformer(mcfg).to(ctx.device)
    with collective_guard(ctx, "optimizer set-up"):
        opt = build_optimizer(cfg, model)
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 * ctx.rank + 1)

    start = 0
    found = latest_checkpoint(out) if cfg.resume else None
    if found is None and cfg.resume is False and (out / CHECKPOINTS / LATEST).exists():
        raise ParameterError("resume", False, f"{out} holds a checkpoint: pass --resume or "
                             "choose a fresh --out")
    if found is not None:
        _check_resumable(out, cfg, ctx.world_size)
        start, ckpt_dir = found
        load_checkpoint(ctx, ckpt_dir, start, model, opt, gen)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        if found is None:
            atomic_write_json(out / CONFIG, dict(cfg.to_dict(), world_size=ctx.world_size))
        _truncate_metrics(out, start)
        if found is not None:
            print(f"resuming {out} at step {start}", flush=True)
    if ctx.initialized:
        with collective_guard(ctx, "start barrier"):
            dist.barrier()

    fault_at = _fault_step(ctx.rank)
    group = opt.param_groups
    model.train()
    for step in range(start, cfg.steps):
        if fault_at is not None and step == fault_at:
            os.kill(os.getpid(), signal.SIGKILL)        # test hook: simulate kill -9 of a worker
        lr = cosine_lr(step, cfg.steps, cfg.warmup, cfg.lr, cfg.min_lr_ratio)
        for g in group:
            g["lr"] = lr
        t0 = time.perf_counter()
        x, y = sample_batch(train_data, cfg.batch_size, mcfg.context, gen)
        x, y = x.to(ctx.device), y.to(ctx.device)
        loss = lm_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with collective_guard(ctx, f"optimizer step {step}"):
            opt.step()
        loss_t = loss.detach().reshape(1).to(torch.float64)
        if ctx.initialized:
            with collective_guard(ctx, f"loss all-reduce at step {step}"):
                dist.all_reduce(loss_t)
            loss_t /= ctx.world_size
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        dt = time.perf_counter() - t0
        mean_loss = float(loss_t.item())
        if not math.isfinite(mean_loss):
            raise FloatingPointError(f"rank {ctx.rank}: loss is {mean_loss} at step {step} "
                                     f"({cfg.run_name}); lower lr or raise warmup")
        if ctx.is_main:
            stats = opt.comm_stats()
            append_jsonl(out / METRICS, {
                "step": step, "loss": mean_loss, "lr": lr, "step_time_s": dt,
                **{f"bytes_{k}": int(v) for k, v in stats.items()}})
        done = step + 1
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            save_checkpoint(ctx, out, done, model, opt, gen)

    rss = torch.tensor([peak_rss_bytes()], dtype=torch.int64, device=ctx.device)
    if ctx.initialized:     # tensors on the device: NCCL cannot gather CPU tensors
        gathered = [torch.zeros(1, dtype=torch.int64, device=ctx.device)
                    for _ in range(ctx.world_size)]
        with collective_guard(ctx, "final peak-RSS gather"):
            dist.all_gather(gathered, rss)
        rss_per_rank = [int(t.item()) for t in gathered]
    else:
        rss_per_rank = [int(rss.item())]
    if ctx.is_main:
        _finish(cfg, ctx, out, model, mcfg, rss_per_rank)
    return out


def _finish(cfg: ScapeTrainConfig, ctx: DistContext, out: Path, model: torch.nn.Module,
            mcfg: ModelConfig, rss_per_rank: list[int]) -> None:
    """Rank 0 only, after the last collective: evaluation and the summary."""
    val = load_split_data(cfg.corpus_dir, "val")
    model.eval()
    dev = ctx.device

    def logits_fn(x: torch.Tensor) -> torch.Tensor:
        return model(x.to(dev)).float().cpu()

    losses = evaluate_losses(logits_fn, val, mcfg.context, cfg.eval_batch_size, cfg.eval_batches)
    bpb = bits_per_byte(losses)
    write_eval_losses(out, losses, cfg.eval_batch_size, mcfg.context)
    atomic_torch_save({"step": cfg.steps, "model": model.state_dict()}, out / FINAL_MODEL)
    records = [r for r in read_jsonl(out / METRICS) if "eval_bpb" not in r]
    times = [r["step_time_s"] for r in records]
    kinds = ("grad_values", "param_values", "mask", "total")
    bytes_mean = {k: float(np.mean([r[f"bytes_{k}"] for r in records])) for k in kinds}
    steady = [r for r in records if r["step"] >= 1] or records
    bytes_steady = {k: float(np.mean([r[f"bytes_{k}"] for r in steady])) for k in kinds}
    tokens = cfg.steps * cfg.batch_size * mcfg.context * ctx.world_size
    append_jsonl(out / METRICS, {"step": cfg.steps, "eval_bpb": bpb})
    write_summary(out, {
        "name": cfg.run_name, "method": cfg.optimizer,
        "corpus": cfg.corpus or Path(cfg.corpus_dir).name, "steps": cfg.steps,
        "tokens": tokens, "final_bpb": bpb,
        "tokens_per_s": tokens / max(sum(times), 1e-12),
        "mean_step_time_s": float(np.mean(times)),
        "peak_rss_bytes": int(sum(rss_per_rank)), "peak_rss_bytes_per_rank": rss_per_rank,
        "seed": cfg.seed, "world_size": ctx.world_size, "sparsity": cfg.sparsity,
        "bytes_per_step": bytes_mean, "bytes_per_step_after_step0": bytes_steady,
        "mask_score": cfg.mask_score if cfg.optimizer == "scape" else None,
        "model": mcfg.to_dict(), "batch_size_per_worker": cfg.batch_size, "lr": cfg.lr,
        "warmup": cfg.warmup, "device": str(ctx.device), "backend": ctx.backend,
    })
    print(f"{cfg.run_name}: {bpb:.4f} bits/byte after {cfg.steps} steps "
          f"({tokens / max(sum(times), 1e-12):.0f} tokens/s, world {ctx.world_size})",
          file=sys.stdout, flush=True)
