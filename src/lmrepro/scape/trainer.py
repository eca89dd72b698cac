"""The per-worker training loop of ``lmrepro train-scape`` (run under ``torchrun``).

One process per data-parallel rank. Every rank builds the same ``ByteTransformer`` from the same
seed, samples its own batches from a per-rank seeded ``torch.Generator``, calls
``loss.backward()`` then ``opt.step()``; the optimizer (SCAPE, TopKEF, or the dense wrapper
around AdamW / AdamS) does the gradient communication itself. Rank 0 writes the run directory in
the layout of :mod:`lmrepro.results`.

Checkpoints (``--checkpoint-every``) use the one format of :mod:`lmrepro.results`:
``OUT/checkpoints/step_XXXXXXX/rank{r}.pt`` (each rank: its optimizer state with its
error-feedback residual and the in-flight mask, and its batch generator state; rank 0 also the
replicated parameters), written atomically; after a barrier rank 0 points
``OUT/checkpoints/latest.json`` at the new directory, so a kill at any moment leaves the previous
complete checkpoint. A relaunch with the same
arguments resumes from it (``--no-resume`` to forbid) and reproduces the uninterrupted run's
parameters and per-step losses bit for bit on CPU. The final parameters are saved as
``OUT/model_final.pt``. Every method clips the global norm of its averaged (SCAPE: synced)
gradient to ``max_grad_norm`` and uses the same weight-decay groups and lr schedule
(:func:`build_optimizer`). A run whose loss or gradient stops being finite is stopped there on
every rank and recorded as diverged (``RunSummary.diverged_at_step``, no ``final_bpb``), so a
suite or sweep goes on.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lmrepro.data.batches import sample_batch
from lmrepro.data.prepare import load_split
from lmrepro.distributed import (DistContext, DistributedFailure, collective_guard, init_from_env,
                                 report_failure, shutdown)
from lmrepro.errors import ParameterError
from lmrepro.evaluation import bits_per_byte, cosine_lr, evaluate_losses
from lmrepro.io import append_jsonl, atomic_torch_save, read_jsonl
from lmrepro.lifetime import fault_armed, fault_point
from lmrepro.memory import Memory, MemorySampler, memory_fields
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.optim import SCAPE, AdamS, DenseDP, NonFiniteGradientError, TopKEF, weight_decay_groups
from lmrepro.results import (METRICS, SUMMARY, RunSummary, load_checkpoint, mean_bytes,
                             publish_checkpoint, save_checkpoint, step_time_std,
                             truncate_metrics, write_eval_losses, write_summary, writer_lock)
from lmrepro.scape.config import RESUME_FREE, ScapeConfig, ScapeRun

FINAL_MODEL = "model_final.pt"


@dataclass(frozen=True)
class RunTarget:
    """Where one run reads and writes, and what it is called (the ``train-scape`` run flags)."""

    corpus_dir: str
    out: str
    seed: int = 0
    corpus: str = ""
    resume: bool = True


def check_prepared(corpus_dir: str | os.PathLike) -> None:
    """A clear error if ``corpus_dir`` is not a prepared corpus."""
    if not (Path(corpus_dir) / "manifest.json").exists():
        raise ParameterError("corpus_dir", str(corpus_dir),
                             "must be a prepared corpus (with manifest.json); run `lmrepro "
                             "prepare` first")


def load_split_data(corpus_dir: str | os.PathLike, split: str) -> np.ndarray:
    """A prepared split (verified uint8 memmap); a clear error if the directory is not one."""
    check_prepared(corpus_dir)
    return load_split(corpus_dir, split)


def build_optimizer(cfg: ScapeConfig, run: ScapeRun, model: torch.nn.Module) -> Any:
    """The optimizer of ``run`` under the suite's shared harness: every method gets the package's
    weight-decay groups (:func:`lmrepro.optim.weight_decay_groups`: no decay on 1-D tensors and
    embeddings), the run's learning rate, the suite's betas, eps and ``max_grad_norm`` (the
    global norm of the averaged, for SCAPE the synced, gradient), and AdamS-based methods the
    suite's ``bias_correction``. Every optimizer exposes ``comm_stats()``."""
    groups = weight_decay_groups(model, cfg.weight_decay)
    lr, betas = run.lr_or(cfg.lr), (cfg.beta1, cfg.beta2)

    def adams() -> AdamS:
        return AdamS(groups, lr=lr, betas=betas, eps=cfg.eps, bias_correction=cfg.bias_correction)

    def adamw() -> torch.optim.AdamW:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=cfg.eps, foreach=False)

    if run.optimizer == "adamw":
        return DenseDP(adamw(), max_grad_norm=cfg.max_grad_norm)
    if run.optimizer == "adams":
        return DenseDP(adams(), max_grad_norm=cfg.max_grad_norm)
    if run.optimizer == "scape":
        return SCAPE(groups, lr=lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                     density=run.density, dense_steps=cfg.dense_steps,
                     density_start=cfg.density_start,
                     density_warmup_steps=cfg.density_warmup_steps,
                     exclude_1d_from_topk=cfg.exclude_1d_from_topk,
                     bias_correction=cfg.bias_correction, max_grad_norm=cfg.max_grad_norm,
                     mask_rule=run.mask_rule, decay_scope=run.decay_scope)
    inner = adams() if run.topk_inner == "adams" else adamw()
    return TopKEF(inner, density=run.density, exclude_1d_from_topk=cfg.exclude_1d_from_topk,
                  max_grad_norm=cfg.max_grad_norm, dense_steps=cfg.dense_steps,
                  density_start=cfg.density_start,
                  density_warmup_steps=cfg.density_warmup_steps)


#: SCAPE's per-step mask diagnostics (:meth:`lmrepro.optim.SCAPE._mask_diagnostics`)
MASK_DIAGNOSTICS = ("mask_kept", "mask_new", "step_stay", "step_enter", "reentry_gap")


def step_record(opt: Any) -> dict[str, Any]:
    """What a step of ``opt`` adds to ``metrics.jsonl`` besides loss, lr and time: bytes by kind,
    and for the sparse methods the density used, the coverage (fraction of the top-k tensors'
    coordinates selected at least once while sparse, and while at the target density), this
    rank's residual norm (gradient units)
    and the synced gradient's norm (before clipping); SCAPE also the wait for its mask."""
    rec: dict[str, Any] = {f"bytes_{k}": int(v) for k, v in opt.comm_stats().items()}
    info = getattr(opt, "last_step_info", None)
    if info is not None:
        rec["density"] = float(info["density"])
        rec["coverage"] = float(opt.coverage())
        rec["coverage_at_target"] = float(opt.coverage(at_target=True))
        rec["residual_norm"] = float(opt.residual_norm())
        rec["grad_norm"] = float(info["grad_norm"])
        if "mask_wait_s" in info:
            rec["mask_wait_s"] = float(info["mask_wait_s"])
        for key in MASK_DIAGNOSTICS:
            if key in info:
                rec[key] = info[key]
    elif getattr(opt, "last_grad_norm", None) is not None:
        rec["grad_norm"] = float(opt.last_grad_norm)
    return rec


def run_identity(cfg: ScapeConfig, run: ScapeRun, model: ModelConfig, target: RunTarget,
                 world_size: int) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it (all but :data:`RESUME_FREE`)."""
    settings = {k: v for k, v in cfg.to_dict().items() if k not in RESUME_FREE}
    return {"settings": settings, "run": run.to_dict(), "model": model.to_dict(),
            "seed": target.seed, "corpus_dir": str(Path(target.corpus_dir).resolve()),
            "world_size": world_size}


def _save(ctx: DistContext, out: Path, step: int, model: torch.nn.Module, opt: Any,
          gen: torch.Generator, identity: dict[str, Any]) -> None:
    """Every rank writes its state, barrier, then rank 0 publishes the checkpoint."""
    state: dict[str, Any] = {"optimizer": opt.state_dict(), "generator": gen.get_state()}
    if ctx.is_main:
        state["model"] = model.state_dict()
    save_checkpoint(out, step, state, rank=ctx.rank)
    if ctx.initialized:
        with collective_guard(ctx, f"checkpoint barrier at step {step}"):
            dist.barrier()
    if ctx.is_main:
        publish_checkpoint(out, step, identity, world_size=ctx.world_size)


def _resume(ctx: DistContext, out: Path, model: torch.nn.Module, opt: Any,
            gen: torch.Generator, identity: dict[str, Any]) -> int:
    """Load the last complete checkpoint into this rank; return its step (0 if none)."""
    mine = load_checkpoint(out, identity, rank=ctx.rank, world_size=ctx.world_size)
    if mine is None:
        return 0
    model_state = mine["model"] if ctx.is_main else load_checkpoint(out, identity, 0,
                                                                    ctx.world_size)["model"]
    with torch.no_grad():
        model.load_state_dict(model_state)
    opt.load_state_dict(mine["optimizer"])
    gen.set_state(mine["generator"])
    return int(mine["step"])


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------
def _record_divergence(ctx: DistContext, out: Path, run: ScapeRun, step: int, dt: float,
                       why: str) -> None:
    """Rank 0 logs the step that diverged (its time; no loss) and says so."""
    if ctx.is_main:
        append_jsonl(out / METRICS, {"step": step, "step_time_s": dt, "diverged": why})
        print(f"{run.run_name}: diverged at step {step}: {why}", flush=True)


def train(cfg: ScapeConfig, run: ScapeRun, model_cfg: ModelConfig, target: RunTarget) -> Path:
    """Run (or resume, or skip if finished) one distributed training run; returns the run dir."""
    check_prepared(target.corpus_dir)      # before the lock creates the run directory
    ctx = init_from_env(cfg.timeout_s, cfg.device)
    try:
        with writer_lock(target.out, enabled=ctx.is_main):   # one writer: rank 0 holds it
            return _train(cfg, run, model_cfg, target, ctx)
    except DistributedFailure as exc:
        report_failure(ctx, exc)
        raise
    finally:
        shutdown(ctx)


def _train(cfg: ScapeConfig, run: ScapeRun, mcfg: ModelConfig, target: RunTarget,
           ctx: DistContext) -> Path:
    torch.set_num_threads(cfg.threads)
    sampler = MemorySampler(children=False).start()    # this worker; rank 0 adds them up
    out = Path(target.out)
    if (out / SUMMARY).exists():
        if ctx.is_main:
            print(f"{out / SUMMARY} exists: run already finished, nothing to do", flush=True)
        return out
    train_data = load_split_data(target.corpus_dir, "train")
    torch.manual_seed(target.seed)
    model = ByteTransformer(mcfg).to(ctx.device)
    with collective_guard(ctx, "optimizer set-up"):
        opt = build_optimizer(cfg, run, model)
    gen = torch.Generator().manual_seed(target.seed * 1_000_003 + 7919 * ctx.rank + 1)

    identity = run_identity(cfg, run, mcfg, target, ctx.world_size)
    if not target.resume and (out / "checkpoints").exists():
        raise ParameterError("resume", False, f"{out} holds a checkpoint: pass --resume or "
                             "choose a fresh --out")
    start = _resume(ctx, out, model, opt, gen, identity) if target.resume else 0
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        truncate_metrics(out, start)
        if start:
            print(f"resuming {out} at step {start}", flush=True)
    if ctx.initialized:
        with collective_guard(ctx, "start barrier"):
            dist.barrier()

    group = opt.param_groups
    peak_lr = run.lr_or(cfg.lr)
    diverged: int | None = None
    model.train()
    for step in range(start, cfg.steps):
        fault_point(f"scape-step@{step}:rank{ctx.rank}")   # test hook: kill -9 of a worker
        lr = cosine_lr(step, cfg.steps, cfg.warmup_steps, peak_lr, cfg.min_lr_ratio)
        for g in group:
            g["lr"] = lr
        t0 = time.perf_counter()
        x, y = sample_batch(train_data, cfg.batch_size, mcfg.context, gen)
        x, y = x.to(ctx.device), y.to(ctx.device)
        loss = lm_loss(model(x), y)
        if fault_armed(f"scape-nan-loss@{step}:rank{ctx.rank}"):
            loss = loss * float("nan")                  # test hook: a diverging rank
        opt.zero_grad(set_to_none=True)
        loss.backward()
        try:
            with collective_guard(ctx, f"optimizer step {step}"):
                opt.step()
        except NonFiniteGradientError as err:   # raised on every rank at once, nothing updated
            diverged = step
            _record_divergence(ctx, out, run, step, time.perf_counter() - t0, str(err))
            break
        loss_t = loss.detach().reshape(1).to(torch.float64)
        if ctx.initialized:
            with collective_guard(ctx, f"loss all-reduce at step {step}"):
                dist.all_reduce(loss_t)
            loss_t /= ctx.world_size
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        dt = time.perf_counter() - t0
        mean_loss = float(loss_t.item())
        if not math.isfinite(mean_loss):               # the same on every rank (all-reduced)
            diverged = step
            _record_divergence(ctx, out, run, step, dt, f"mean loss {mean_loss}")
            break
        if ctx.is_main:
            append_jsonl(out / METRICS, {"step": step, "loss": mean_loss, "lr": lr,
                                         "step_time_s": dt, **step_record(opt)})
        done = step + 1
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            _save(ctx, out, done, model, opt, gen, identity)

    peak = sampler.stop()
    mine = torch.tensor([peak.rss, peak.pss, peak.uss], dtype=torch.int64, device=ctx.device)
    if ctx.initialized:     # tensors on the device: NCCL cannot gather CPU tensors
        gathered = [torch.zeros(3, dtype=torch.int64, device=ctx.device)
                    for _ in range(ctx.world_size)]
        with collective_guard(ctx, "final peak-memory gather"):
            dist.all_gather(gathered, mine)
    else:
        gathered = [mine]
    per_rank = [Memory(*(int(v) for v in t.tolist())) for t in gathered]
    if ctx.is_main:
        _finish(cfg, run, mcfg, target, ctx, out, model, per_rank, start, diverged)
    return out


def _finish(cfg: ScapeConfig, run: ScapeRun, mcfg: ModelConfig, target: RunTarget,
            ctx: DistContext, out: Path, model: torch.nn.Module, per_rank: list[Memory],
            start: int, diverged: int | None) -> None:
    """Rank 0 only, after the last collective: evaluation and the summary. A diverged run is not
    evaluated (no final model): its summary says where it stopped and has no ``final_bpb``."""
    records = [r for r in read_jsonl(out / METRICS) if "eval_bpb" not in r]
    trained = cfg.steps if diverged is None else diverged + 1     # steps computed
    bpb: float | None = None
    test_bpb: float | None = None
    if diverged is None:
        val = load_split_data(target.corpus_dir, "val")
        model.eval()
        dev = ctx.device

        def logits_fn(x: torch.Tensor) -> torch.Tensor:
            return model(x.to(dev)).float().cpu()

        losses = evaluate_losses(logits_fn, val, mcfg.context, cfg.eval_batch_size,
                                 cfg.eval_batches)
        bpb = bits_per_byte(losses)
        write_eval_losses(out, losses, cfg.eval_batch_size, mcfg.context)
        # the held-out test split: what a verdict tuned on the validation split is judged on
        test_losses = evaluate_losses(logits_fn, load_split_data(target.corpus_dir, "test"),
                                      mcfg.context, cfg.eval_batch_size, cfg.eval_batches)
        test_bpb = bits_per_byte(test_losses)
        write_eval_losses(out, test_losses, cfg.eval_batch_size, mcfg.context, split="test")
        atomic_torch_save({"step": cfg.steps, "model": model.state_dict()}, out / FINAL_MODEL)
        append_jsonl(out / METRICS, {"step": cfg.steps, "eval_bpb": bpb})
    times = [r["step_time_s"] for r in records]
    steady = [r for r in records if r["step"] >= 1] or records
    tokens = trained * cfg.batch_size * mcfg.context * ctx.world_size
    sparse = [r for r in records if "coverage" in r]
    write_summary(out, RunSummary(
        name=run.run_name, method=run.method,
        corpus=target.corpus or Path(target.corpus_dir).name, seed=target.seed,
        steps=cfg.steps, tokens=tokens, final_bpb=bpb, diverged_at_step=diverged,
        tokens_per_s=tokens / max(sum(times), 1e-12),
        mean_step_time_s=float(np.mean(times)), train_time_s=float(sum(times)),
        step_time_std_s=step_time_std(records),
        **memory_fields(None, processes_peaks=per_rank),
        n_params=sum(p.numel() for p in model.parameters()), processes=ctx.world_size,
        threads=ctx.world_size * cfg.threads, resumed_from_step=start, sparsity=run.sparsity,
        bytes_per_step=mean_bytes(records), bytes_per_step_after_step0=mean_bytes(steady),
        details={"peak_rss_bytes_per_rank": [m.rss for m in per_rank],
                 "device": str(ctx.device), "backend": ctx.backend,
                 "batch_size_per_worker": cfg.batch_size, "lr": run.lr_or(cfg.lr),
                 "mask_rule": run.mask_rule if run.optimizer == "scape" else None,
                 "decay_scope": run.decay_scope if run.optimizer == "scape" else None,
                 "final_test_bpb": test_bpb,
                 "topk_inner": run.topk_inner if run.optimizer == "topk" else None,
                 "final_coverage": sparse[-1]["coverage"] if sparse else None,
                 "final_coverage_at_target": (sparse[-1].get("coverage_at_target")
                                              if sparse else None),
                 "max_residual_norm": max((r["residual_norm"] for r in sparse), default=None),
                 "mean_density": (float(np.mean([r["density"] for r in sparse]))
                                  if sparse else None)},
        config={"settings": cfg.to_dict(), "run": run.to_dict(), "model": mcfg.to_dict()}))
    if bpb is None:
        print(f"{run.run_name}: DIVERGED at step {diverged} (lr {run.lr_or(cfg.lr):g}); recorded "
              f"in {out / SUMMARY}", file=sys.stdout, flush=True)
        return
    print(f"{run.run_name}: {bpb:.4f} bits/byte after {cfg.steps} steps "
          f"({tokens / max(sum(times), 1e-12):.0f} tokens/s, world {ctx.world_size})",
          file=sys.stdout, flush=True)
