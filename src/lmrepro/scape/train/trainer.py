"""The per-worker training loop of ``lmrepro train-scape`` (run under ``torchrun``).

One process per data-parallel rank. Every rank builds the same ``ByteTransformer`` from the same
seed, samples its own batches from a per-rank seeded ``torch.Generator``, calls
``loss.backward()`` then ``opt.step()``; the optimizer (SCAPE, TopKEF, or the dense wrapper
around AdamW / AdamS) does the gradient communication itself. Rank 0 writes the run directory in
the layout of :mod:`lmrepro.results`.

Checkpoints (``--checkpoint-every``) go through the run's checkpoint manager
(:mod:`lmrepro.checkpoints`): ``OUT/checkpoints/step_XXXXXXX/rank{r}.pt`` (each rank: its
optimizer state with its error-feedback residual and the in-flight mask, and its batch generator
state; rank 0 also the replicated parameters), written atomically; after a barrier rank 0 points
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

import contextlib
import math
import os
import sys
from collections.abc import Callable
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
from lmrepro.evaluation import bits_per_byte, evaluate_losses
from lmrepro.harness import Cadence, Diverged, Place, Run, Schedule, StepFn
from lmrepro.io import atomic_torch_save
from lmrepro.lifetime import fault_armed, fault_point
from lmrepro.memory import Memory, MemorySampler, memory_fields
from lmrepro.model import ByteTransformer, ModelConfig, lm_loss
from lmrepro.optim import SCAPE, AdamS, DenseDP, NonFiniteGradientError, TopKEF, weight_decay_groups
from lmrepro.results import SUMMARY, mean_bytes
from lmrepro.scape.config import RESUME_FREE, SPARSE_OPTIMIZERS, ScapeConfig, ScapeRun
from lmrepro.seeds import batches_of_rank, seed_init

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


def build_optimizer(cfg: ScapeConfig, run: ScapeRun, model: torch.nn.Module,
                    process_group: Any = None) -> Any:
    """The optimizer of ``run`` under the suite's shared harness: every method gets the package's
    weight-decay groups (:func:`lmrepro.optim.weight_decay_groups`: no decay on 1-D tensors and
    embeddings), the run's learning rate, the suite's betas, eps and ``max_grad_norm`` (the
    global norm of the averaged, for SCAPE the synced, gradient), and AdamS-based methods the
    suite's ``bias_correction``. Every optimizer exposes ``comm_stats()``; ``process_group``
    is the optimizers' (default: the world)."""
    groups = weight_decay_groups(model, cfg.weight_decay)
    lr, betas = run.lr_or(cfg.lr), (cfg.beta1, cfg.beta2)

    def adams() -> AdamS:
        return AdamS(groups, lr=lr, betas=betas, eps=cfg.eps, bias_correction=cfg.bias_correction)

    def adamw() -> torch.optim.AdamW:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=cfg.eps, foreach=False)

    if run.optimizer == "adamw":
        return DenseDP(adamw(), max_grad_norm=cfg.max_grad_norm, process_group=process_group)
    if run.optimizer == "adams":
        return DenseDP(adams(), max_grad_norm=cfg.max_grad_norm, process_group=process_group)
    if run.optimizer == "scape":
        return SCAPE(groups, lr=lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                     sparsity=run.sparsity, dense_steps=run.dense_steps_or(cfg.dense_steps),
                     sparsity_start=cfg.sparsity_start,
                     sparsity_warmup_steps=cfg.sparsity_warmup_steps,
                     exclude_1d_from_topk=cfg.exclude_1d_from_topk,
                     bias_correction=cfg.bias_correction, max_grad_norm=cfg.max_grad_norm,
                     mask_rule=run.mask_rule, decay_scope=run.decay_scope,
                     off_mask_momentum=run.momentum_rule, process_group=process_group)
    inner = adams() if run.topk_inner == "adams" else adamw()
    return TopKEF(inner, sparsity=run.sparsity, exclude_1d_from_topk=cfg.exclude_1d_from_topk,
                  max_grad_norm=cfg.max_grad_norm,
                  dense_steps=run.dense_steps_or(cfg.dense_steps),
                  sparsity_start=cfg.sparsity_start,
                  sparsity_warmup_steps=cfg.sparsity_warmup_steps,
                  off_mask_momentum=run.momentum_rule, process_group=process_group)


#: SCAPE's per-step mask diagnostics (:meth:`lmrepro.optim.SCAPE._mask_diagnostics`)
MASK_DIAGNOSTICS = ("mask_kept", "mask_new", "step_stay", "step_enter", "reentry_gap",
                    "recent_coverage", "off_mask_mass")


def step_record(opt: Any) -> dict[str, Any]:
    """What a step of ``opt`` adds to ``metrics.jsonl`` besides loss, lr and time: bytes by kind,
    and for the sparse methods the sparsity reached (1-D tensors sent whole count as sent), the
    coverage (fraction of the top-k tensors'
    coordinates selected at least once while sparse, and while at the target density), this
    rank's residual norm (gradient units)
    and the synced gradient's norm (before clipping); SCAPE also the wait for its mask."""
    rec: dict[str, Any] = {f"bytes_{k}": int(v) for k, v in opt.comm_stats().items()}
    info = getattr(opt, "last_step_info", None)
    if info is not None:
        rec["sparsity"] = float(info["sparsity"])
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


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------
def train(cfg: ScapeConfig, run: ScapeRun, model_cfg: ModelConfig, target: RunTarget) -> Path:
    """Run (or resume, or skip if finished) one distributed training run; returns the run dir."""
    check_prepared(target.corpus_dir)      # before the lock creates the run directory
    ctx = init_from_env(cfg.timeout_s, cfg.device)
    try:
        return _train(cfg, run, model_cfg, target, ctx)
    except DistributedFailure as exc:
        report_failure(ctx, exc)
        raise
    finally:
        shutdown(ctx)


def _harness(cfg: ScapeConfig, run: ScapeRun, mcfg: ModelConfig, target: RunTarget,
             ctx: DistContext) -> Run:
    """The run's harness: checkpoints every ``checkpoint_every`` steps before the last, every
    step logged, evaluations after the step counts of ``eval_at`` (rank 0); one writer."""

    def barrier(what: str) -> None:
        if ctx.initialized:
            with collective_guard(ctx, what):
                dist.barrier()

    return Run(target.out, run_identity(cfg, run, mcfg, target, ctx.world_size),
               Schedule.of(cfg, run.lr_or(cfg.lr)),
               Cadence(cfg.steps, cfg.checkpoint_every, eval_at=frozenset(cfg.eval_at),
                     keep_at=frozenset(cfg.keep_checkpoints_at)),
               cfg.batch_size * mcfg.context * ctx.world_size,
               sampler=MemorySampler(children=False),     # this worker; rank 0 adds them up
               place=Place(ctx.rank, ctx.world_size, barrier))


def _train(cfg: ScapeConfig, run: ScapeRun, mcfg: ModelConfig, target: RunTarget,
           ctx: DistContext) -> Path:
    torch.set_num_threads(cfg.threads)
    out = Path(target.out)
    with _harness(cfg, run, mcfg, target, ctx) as harness:
        if harness.finished():
            if ctx.is_main:
                print(f"{out / SUMMARY} exists: run already finished, nothing to do", flush=True)
            return out
        train_data = load_split_data(target.corpus_dir, "train")
        seed_init(target.seed)
        model = ByteTransformer(mcfg).to(ctx.device)
        with collective_guard(ctx, "optimizer set-up"):
            opt = build_optimizer(cfg, run, model)
        gen = batches_of_rank(target.seed, ctx.rank)

        def restore(mine: dict[str, Any]) -> None:
            main = mine if ctx.is_main else harness.checkpoints.load(rank=0)
            assert main is not None      # rank 0's part of the checkpoint this rank resumes
            model_state = main["model"]
            with torch.no_grad():
                model.load_state_dict(model_state)
            opt.load_state_dict(mine["optimizer"])
            gen.set_state(mine["generator"])

        def state() -> dict[str, Any]:
            return {"optimizer": opt.state_dict(), "generator": gen.get_state(),
                    **({"model": model.state_dict()} if ctx.is_main else {})}

        if not target.resume and harness.checkpoints.exists():
            raise ParameterError("resume", False, f"{out} holds a checkpoint: pass --resume or "
                                 "choose a fresh --out")
        start = harness.resume(restore)
        if ctx.is_main and start:
            print(f"resuming {out} at step {start}", flush=True)
        assert harness.place.barrier is not None
        harness.place.barrier("start barrier")
        model.train()
        diverged = harness.train(_step_fn(cfg, mcfg, ctx, model, opt, gen, train_data), state,
                                 _curve_point(cfg, mcfg, target, ctx, model))
        if diverged is not None and ctx.is_main:
            print(f"{run.run_name}: diverged at step {diverged}: "
                  f"{harness.records[-1]['diverged']}", flush=True)
        per_rank = _gather_peaks(ctx, harness.peak())
        if ctx.is_main:
            _finish(cfg, run, mcfg, target, ctx, harness, model, per_rank, diverged)
    return out


def training_forward(cfg: ScapeConfig, model: torch.nn.Module) -> torch.nn.Module:
    """The module the training steps call: ``torch.compile(model)`` with ``compile`` (the
    parameters stay ``model``'s, so checkpoints and evaluation read them as ever), else
    ``model``."""
    return torch.compile(model) if cfg.compile else model  # type: ignore[return-value]


def autocast(cfg: ScapeConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's precision: bf16 autocast with ``precision: bf16`` (matrix products
    in bfloat16 on fp32 weights; the gradients land in the fp32 parameters, so the optimizer
    state and the gradient all-reduce stay fp32), else nothing."""
    if cfg.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _step_fn(cfg: ScapeConfig, mcfg: ModelConfig, ctx: DistContext, model: torch.nn.Module,
             opt: Any, gen: torch.Generator, train_data: np.ndarray) -> StepFn:
    """This rank's step: its batch, forward (in the run's precision), backward, then the
    optimizer's step, which communicates the gradient; the loss averaged over ranks. A
    non-finite loss or gradient is the same on every rank (all-reduced): :class:`Diverged`
    everywhere, nothing updated."""
    forward = training_forward(cfg, model)

    def step(i: int, lr: float) -> dict[str, Any]:
        fault_point(f"scape-step@{i}:rank{ctx.rank}")   # test hook: kill -9 of a worker
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = sample_batch(train_data, cfg.batch_size, mcfg.context, gen)
        x, y = x.to(ctx.device), y.to(ctx.device)
        with autocast(cfg, ctx.device):
            logits = forward(x)
        loss = lm_loss(logits.float(), y)     # the loss in fp32 (a no-op on fp32 logits)
        if fault_armed(f"scape-nan-loss@{i}:rank{ctx.rank}"):
            loss = loss * float("nan")                  # test hook: a diverging rank
        opt.zero_grad(set_to_none=True)
        loss.backward()
        try:
            with collective_guard(ctx, f"optimizer step {i}"):
                opt.step()
        except NonFiniteGradientError as err:   # raised on every rank at once, nothing updated
            raise Diverged(str(err)) from None
        loss_t = loss.detach().reshape(1).to(torch.float64)
        if ctx.initialized:
            with collective_guard(ctx, f"loss all-reduce at step {i}"):
                dist.all_reduce(loss_t)
            loss_t /= ctx.world_size
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        mean_loss = float(loss_t.item())
        if not math.isfinite(mean_loss):
            raise Diverged(f"mean loss {mean_loss}")
        return {"loss": mean_loss, **step_record(opt)}

    return step


def _gather_peaks(ctx: DistContext, peak: Memory) -> list[Memory]:
    """Every rank's peak memory (on rank 0; the last collective of the run)."""
    mine = torch.tensor([peak.rss, peak.pss, peak.uss], dtype=torch.int64, device=ctx.device)
    if not ctx.initialized:
        return [peak]
    gathered = [torch.zeros(3, dtype=torch.int64, device=ctx.device)    # NCCL: device tensors
                for _ in range(ctx.world_size)]
    with collective_guard(ctx, "final peak-memory gather"):
        dist.all_gather(gathered, mine)
    return [Memory(*(int(v) for v in t.tolist())) for t in gathered]


def _evaluate(cfg: ScapeConfig, mcfg: ModelConfig, target: RunTarget, ctx: DistContext,
              model: torch.nn.Module, split: str) -> list[float]:
    """The final model's per-batch losses on a split of the prepared corpus."""
    model.eval()
    dev = ctx.device

    def logits_fn(x: torch.Tensor) -> torch.Tensor:
        return model(x.to(dev)).float().cpu()

    return evaluate_losses(logits_fn, load_split_data(target.corpus_dir, split), mcfg.context,
                           cfg.eval_batch_size, cfg.eval_batches)


def _curve_point(cfg: ScapeConfig, mcfg: ModelConfig, target: RunTarget, ctx: DistContext,
                 model: torch.nn.Module) -> Callable[[], dict[str, float]] | None:
    """Rank 0's evaluation during the run (``eval_at``): validation and test bits per byte.
    The other ranks wait at the next step's collective; no random state is drawn, so the run's
    numbers are those of a run without evaluations."""
    if not (cfg.eval_at and ctx.is_main):
        return None

    def point() -> dict[str, float]:
        out = {"eval_bpb": bits_per_byte(_evaluate(cfg, mcfg, target, ctx, model, "val")),
               "test_bpb": bits_per_byte(_evaluate(cfg, mcfg, target, ctx, model, "test"))}
        model.train()
        return out

    return point


def _details(cfg: ScapeConfig, run: ScapeRun, ctx: DistContext, records: list[dict],
             per_rank: list[Memory], test_bpb: float | None) -> dict[str, Any]:
    """The summary's SCAPE-suite details (:class:`~lmrepro.scape.details.ScapeDetails`: the
    target sparsity, the sparse methods' coverage, residual, sparsity reached)."""
    sparse = [r for r in records if "coverage" in r]
    return {"sparsity": run.sparsity, "peak_rss_bytes_per_rank": [m.rss for m in per_rank],
            "device": str(ctx.device), "backend": ctx.backend,
            "batch_size_per_worker": cfg.batch_size, "lr": run.lr_or(cfg.lr),
            "mask_rule": run.mask_rule if run.optimizer == "scape" else None,
            "decay_scope": run.decay_scope if run.optimizer == "scape" else None,
            "off_mask_momentum": (run.momentum_rule if run.optimizer in SPARSE_OPTIMIZERS
                                  else None),
            "dense_steps": (run.dense_steps_or(cfg.dense_steps)
                            if run.optimizer in SPARSE_OPTIMIZERS else None),
            "final_test_bpb": test_bpb,
            "topk_inner": run.topk_inner if run.optimizer == "topk" else None,
            "final_coverage": sparse[-1]["coverage"] if sparse else None,
            "final_coverage_at_target": (sparse[-1].get("coverage_at_target")
                                         if sparse else None),
            "max_residual_norm": max((r["residual_norm"] for r in sparse), default=None),
            "mean_sparsity": (float(np.mean([r["sparsity"] for r in sparse]))
                              if sparse else None)}


def _finish(cfg: ScapeConfig, run: ScapeRun, mcfg: ModelConfig, target: RunTarget,
            ctx: DistContext, harness: Run, model: torch.nn.Module, per_rank: list[Memory],
            diverged: int | None) -> None:
    """Rank 0 only, after the last collective: evaluation and the summary. A diverged run is not
    evaluated (no final model): its summary says where it stopped and has no ``final_bpb``."""
    out = Path(target.out)
    records = list(harness.records)
    bpb = test_bpb = None
    losses = test_losses = None
    if diverged is None:
        losses = _evaluate(cfg, mcfg, target, ctx, model, "val")
        bpb = bits_per_byte(losses)
        # the held-out test split: what a verdict tuned on the validation split is judged on
        test_losses = _evaluate(cfg, mcfg, target, ctx, model, "test")
        test_bpb = bits_per_byte(test_losses)
        atomic_torch_save({"step": cfg.steps, "model": model.state_dict()}, out / FINAL_MODEL)
        harness.log({"step": cfg.steps, "eval_bpb": bpb})
    steady = [r for r in records if r["step"] >= 1] or records
    summary = harness.finish(harness.summary({
        "name": run.run_name, "method": run.method,
        "corpus": target.corpus or Path(target.corpus_dir).name, "seed": target.seed,
        "final_bpb": bpb, "diverged_at_step": diverged,
        **memory_fields(None, processes_peaks=per_rank),
        "n_params": sum(p.numel() for p in model.parameters()), "processes": ctx.world_size,
        "threads": ctx.world_size * cfg.threads,
        "bytes_per_step": mean_bytes(records), "bytes_per_step_after_step0": mean_bytes(steady),
        "details": _details(cfg, run, ctx, records, per_rank, test_bpb),
        "config": {"settings": cfg.to_dict(), "run": run.to_dict(), "model": mcfg.to_dict()}},
        trained=cfg.steps if diverged is None else diverged + 1),
        losses, cfg.eval_batch_size, mcfg.context, test_losses)
    if bpb is None:
        print(f"{run.run_name}: DIVERGED at step {diverged} (lr {run.lr_or(cfg.lr):g}); recorded "
              f"in {out / SUMMARY}", file=sys.stdout, flush=True)
        return
    print(f"{run.run_name}: {bpb:.4f} bits/byte after {cfg.steps} steps "
          f"({summary['tokens_per_s']:.0f} tokens/s, world {ctx.world_size})",
          file=sys.stdout, flush=True)
