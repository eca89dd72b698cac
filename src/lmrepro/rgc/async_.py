"""Asynchronous RGC executor: one spawned process per stage (DESIGN.md, "Executors").

Why processes and not threads: torch's intra-op thread count is process-global
(``torch.set_num_threads`` in one Python thread changes it for all), and on the measured model two
Python threads running a stage each got no speed-up over running them in turn (GIL-bound
dispatch of small ops); two spawned processes ran in parallel at single-worker speed. See
docs/rgc.md for the numbers.

Data flow (purely local horizon, H = 1):

* stage 0 samples each step's batch from the seeded generator (the same batches as the sync
  executor), splits it into micro-batches, embeds and runs its blocks;
* each stage sends ``(h_k.detach().clone(), y)`` of every micro-batch to the next stage through a
  bounded ``torch.multiprocessing`` queue (shared-memory tensors), *before* its own backward, so
  the next stage starts while this one is still busy;
* each stage backpropagates its local loss through its blocks and its decoder replica, and
  accumulates over the micro-batches;
* consensus: one gloo ``all_reduce`` (sum, then / K) of the flattened decoder gradients over
  127.0.0.1 per step, so every replica applies the same mean gradient and the replicas stay
  identical without a coordinator round trip;
* the parent only collects per-step losses, states for checkpoints, and errors.

A stage that raises sends its traceback to the parent, which stops every stage and raises
:class:`StageWorkerError` naming the stage; a stage that dies without a word (killed, segfault) is
noticed from its exit code. Every queue get/put and the collective have timeouts
(``config.worker_timeout_s``), so nothing hangs.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_mod
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lmrepro.data.batches import sample_batch
from lmrepro.distributed import free_port
from lmrepro.errors import check
from lmrepro.evaluation import bits_per_byte
from lmrepro.lifetime import die_with_multiprocessing_parent
from lmrepro.memory import MemorySampler
from lmrepro.optim.comm import flat_to_grads, grads_to_flat
from lmrepro.results import holds_writer_lock
from lmrepro.rgc.common import (Clock, Recorder, TrainResult, batch_generator, build_model,
                                evaluate, load_state, lr_at, make_adamw, make_summary,
                                micro_batches, run_identity, save_state, set_lr, state_from_bytes,
                                state_to_bytes)
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.stages import (decoder_parameters, local_loss, run_stage, stage_bounds,
                                stage_parameter_names, stage_parameters)

POLL_S = 0.5


class StageWorkerError(RuntimeError):
    """A stage worker failed; the message carries the stage index and its traceback."""

    def __init__(self, stage: int, detail: str) -> None:
        self.stage = stage
        self.detail = detail
        super().__init__(f"RGC async stage {stage} failed:\n{detail}")


def _get(q: Any, stop: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if stop.is_set():
            raise _Stopped()
        try:
            return q.get(timeout=POLL_S)
        except queue_mod.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {what} "
                                   "(rgc.worker_timeout_s); is the previous stage alive?"
                                   ) from None


def _put(q: Any, item: Any, stop: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if stop.is_set():
            raise _Stopped()
        try:
            q.put(item, timeout=POLL_S)
            return
        except queue_mod.Full:
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f} s to send {what} "
                                   "(rgc.worker_timeout_s); is the next stage alive?"
                                   ) from None


class _Stopped(Exception):
    """The parent asked this stage to stop (another stage failed)."""


def _stage_worker(k: int, cfg_dict: dict, seed: int, port: int, ckpt: bytes | None,
                  stop_step: int, train_data: np.ndarray | None, q_in: Any, q_out: Any,
                  results: Any, stop: Any, finish: Any, fault: tuple[int, int, str] | None
                  ) -> None:
    """Body of stage ``k``'s process; reports ``("ready"|"step"|"state"|"done"|"error", ...)``."""
    die_with_multiprocessing_parent()      # ends with the run's process (docs/reliability.md)
    try:
        cfg = RGCConfig(**cfg_dict)
        K, M = cfg.n_stages, cfg.micro_batches
        torch.set_num_threads(cfg.stage_threads[k])
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=k, world_size=K,
            timeout=datetime.timedelta(seconds=cfg.worker_timeout_s))
        model = build_model(cfg, seed)
        model.train()
        bounds = stage_bounds(cfg.n_layers, cfg.n_stages)
        own = stage_parameters(model, bounds, k)
        names = stage_parameter_names(model, bounds, k)
        dec = decoder_parameters(model)
        opt_stage, opt_dec = make_adamw(model, own, cfg), make_adamw(model, dec, cfg)
        gen = batch_generator(seed) if k == 0 else None
        start = 0
        if ckpt is not None:
            ck = state_from_bytes(ckpt)
            model.load_state_dict(ck["model"])
            opt_stage.load_state_dict(ck["optims"][f"stage{k}"])
            opt_dec.load_state_dict(ck["optims"]["decoder"])
            if gen is not None:
                gen.set_state(ck["gen_state"])
            start = int(ck["step"])
            del ck
        dec_names = [f"decoder.{n}" for n, _ in model.decoder.named_parameters()]
        dec_flat = torch.zeros(sum(p.numel() for p in dec))
        results.put(("ready", k, os.getpid()))
        scale = 1.0 / M
        tmo = cfg.worker_timeout_s
        for step in range(start, stop_step):
            t0 = time.perf_counter()
            if fault is not None and fault[0] == k and fault[1] == step:
                if fault[2] == "exit":
                    os._exit(3)
                if fault[2] == "hang":
                    time.sleep(10 * tmo)
                raise RuntimeError(f"injected fault in stage {k} at step {step}")
            set_lr([opt_stage, opt_dec], lr_at(cfg, step))
            opt_stage.zero_grad(set_to_none=True)
            opt_dec.zero_grad(set_to_none=True)
            if k == 0:
                x, y = sample_batch(train_data, cfg.batch_size, cfg.context, gen)
                micro = micro_batches(x, y, M)
            losses = []
            for m in range(M):
                if k == 0:
                    inp, ym = micro[m]
                else:
                    inp, ym = _get(q_in, stop, tmo, f"step {step} micro-batch {m} from stage "
                                                   f"{k - 1}")
                h = run_stage(model, bounds, k, inp)
                if k < K - 1:
                    _put(q_out, (h.detach().clone(), ym), stop, tmo,
                         f"step {step} micro-batch {m} to stage {k + 1}")
                loss = local_loss(model, h, ym)
                (loss * scale).backward()
                losses.append(float(loss.detach()))
                del h, inp
            flat = grads_to_flat(dec, dec_flat)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat_to_grads(flat / K, dec)
            opt_stage.step()
            opt_dec.step()
            done = step + 1
            results.put(("step", k, step, float(np.mean(losses)), time.perf_counter() - t0))
            want_state = done == stop_step or (
                cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or (
                cfg.eval_every and done % cfg.eval_every == 0)
            if want_state:
                sd = model.state_dict()
                payload: dict[str, Any] = {
                    "params": {n: sd[n] for n in names},
                    "opt_stage": opt_stage.state_dict(),
                }
                if k == 0:
                    payload["decoder"] = {n: sd[n] for n in dec_names}
                    payload["opt_dec"] = opt_dec.state_dict()
                    payload["gen_state"] = gen.get_state()
                results.put(("state", k, done, state_to_bytes(payload)))
        results.put(("done", k, None))
        finish.wait(timeout=tmo)
    except _Stopped:
        pass
    except BaseException:  # noqa: BLE001 - every failure goes to the parent with its traceback
        results.put(("error", k, traceback.format_exc()))
        finish.wait(timeout=30)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def _assemble(cfg: RGCConfig, parts: dict[int, dict]) -> tuple[dict, dict, torch.Tensor]:
    """Full model state, optimizer states by name, and generator state from K stage payloads."""
    model_state: dict[str, torch.Tensor] = {}
    optims: dict[str, dict] = {}
    for k in range(cfg.n_stages):
        model_state.update(parts[k]["params"])
        optims[f"stage{k}"] = parts[k]["opt_stage"]
    model_state.update(parts[0]["decoder"])
    optims["decoder"] = parts[0]["opt_dec"]
    return model_state, optims, parts[0]["gen_state"]


def _mp_context() -> Any:
    """``forkserver`` with torch and this module preloaded: the server imports torch once per
    parent process and forks each stage from a single-threaded process (no inherited OpenMP pool,
    no repeated multi-second import). Falls back to ``spawn`` where forkserver does not exist."""
    try:
        ctx = mp.get_context("forkserver")
    except ValueError:
        return mp.get_context("spawn")
    # torch._dynamo is imported by the first optimizer construction (~3 s per process)
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.optim", "torch.distributed",
                                "lmrepro.rgc.async_"])
    return ctx


@holds_writer_lock("out_dir")     # one writer per run directory (docs/reliability.md)
def train_async(cfg: RGCConfig, train_data: np.ndarray, val_data: np.ndarray,
                out_dir: Path | None = None, corpus: str = "synthetic", name: str | None = None,
                stop_after: int | None = None, fault: tuple[int, int, str] | None = None,
                seed: int = 0) -> TrainResult:
    """Run the async executor; see :func:`lmrepro.rgc.train`. ``fault=(stage, step, kind)``
    injects a failure (``kind`` "raise", "exit" or "hang") for the reliability tests."""
    check(cfg.horizon == 1, "rgc.horizon", cfg.horizon,
          "must be 1 for the async executor (stages exchange only detached activations); "
          "use executor='sync' for a horizon > 1")
    ctx = _mp_context()
    sampler = MemorySampler().start()
    identity = run_identity(cfg, "async", seed)
    ck = load_state(out_dir, identity)
    start = int(ck["step"]) if ck is not None else 0
    ck_bytes = state_to_bytes(ck) if ck is not None else None
    del ck
    end = cfg.steps if stop_after is None else max(start, min(cfg.steps, stop_after))
    rec = Recorder(out_dir, start)
    K = cfg.n_stages
    template = build_model(cfg, seed)
    if end == start:
        return _finish_without_steps(cfg, template, out_dir, val_data, rec, start, sampler,
                                     corpus, name, seed, identity)
    queues = [ctx.Queue(maxsize=cfg.queue_size) for _ in range(K - 1)]
    results = ctx.Queue()
    stop, finish = ctx.Event(), ctx.Event()
    port = free_port()
    procs = []
    for k in range(K):
        p = ctx.Process(
            target=_stage_worker, name=f"rgc-stage-{k}",
            args=(k, {n: getattr(cfg, n) for n in RGCConfig.model_fields}, seed, port, ck_bytes,
                  end, train_data if k == 0 else None,
                  queues[k - 1] if k > 0 else None, queues[k] if k < K - 1 else None,
                  results, stop, finish, fault),
            daemon=True)
        p.start()
        procs.append(p)
    ready = 0
    done_workers = 0
    step_reports: dict[int, dict[int, tuple[float, float]]] = {}
    states: dict[int, dict[int, dict]] = {}
    final_parts: dict[int, dict] | None = None
    clock = Clock()
    last_t = 0.0
    last_msg = time.monotonic()
    # a stage times out on its own after worker_timeout_s; the parent waits a margin longer
    silence_limit = cfg.worker_timeout_s + 60.0
    try:
        while done_workers < K:
            try:
                msg = results.get(timeout=POLL_S)
                last_msg = time.monotonic()
            except queue_mod.Empty:
                for k, p in enumerate(procs):
                    if p.exitcode is not None and p.exitcode != 0:
                        raise StageWorkerError(k, f"process exited with code {p.exitcode} "
                                                  "without a traceback (killed or crashed)"
                                               ) from None
                if time.monotonic() - last_msg > silence_limit:
                    raise TimeoutError(f"no RGC stage reported for {silence_limit:.0f} s "
                                       "(rgc.worker_timeout_s + 60 s); stopped the run"
                                       ) from None
                continue
            kind, k = msg[0], msg[1]
            if kind == "error":
                raise StageWorkerError(k, msg[2])
            if kind == "ready":
                ready += 1
                if ready == K:
                    clock.start()
                    last_t = time.perf_counter()
            elif kind == "step":
                step, loss, _dt = msg[2], msg[3], msg[4]
                step_reports.setdefault(step, {})[k] = (loss, _dt)
                if len(step_reports[step]) == K:
                    now = time.perf_counter()
                    stage_losses = [step_reports[step][j][0] for j in range(K)]
                    rec.log({"step": step, "loss": stage_losses[-1],
                             "stage_losses": stage_losses, "lr": lr_at(cfg, step),
                             "step_time_s": now - last_t})
                    last_t = now
                    del step_reports[step]
            elif kind == "state":
                done_step = msg[2]
                states.setdefault(done_step, {})[k] = state_from_bytes(msg[3])
                if len(states[done_step]) == K:
                    parts = states.pop(done_step)
                    # the clock keeps running: the stages keep computing meanwhile
                    _on_state(cfg, parts, done_step, out_dir, val_data, rec, template, identity)
                    if done_step == end:
                        final_parts = parts
            elif kind == "done":
                done_workers += 1
        clock.pause()
    except BaseException:
        stop.set()
        finish.set()
        _shutdown(procs, grace_s=5.0)
        sampler.stop()
        raise
    finish.set()
    _shutdown(procs, grace_s=30.0)
    check(final_parts is not None, "async run", "no final state", "stages must report a state")
    model_state, _, _ = _assemble(cfg, final_parts)  # type: ignore[arg-type]
    template.load_state_dict(model_state)
    final_state = {n: v.detach().clone() for n, v in template.state_dict().items()}
    if end < cfg.steps:
        n_tokens = (end - start) * cfg.batch_size * cfg.context
        tokens_per_s = n_tokens / clock.total if clock.total > 0 else 0.0
        return TrainResult("async", tokens_per_s, sampler.stop().rss, float("nan"), [], {},
                           rec.records, final_state, out_dir)
    eval_losses = evaluate(template, val_data, cfg)
    peak = sampler.stop()
    summary = rec.finish(cfg, make_summary(cfg, "async", name, corpus, seed, eval_losses, peak,
                                           template.num_parameters(), rec.records, start,
                                           clock.total), eval_losses)
    return TrainResult("async", summary["tokens_per_s"], peak.rss, summary["final_bpb"],
                       eval_losses, summary, rec.records, final_state, out_dir)


def _on_state(cfg: RGCConfig, parts: dict[int, dict], done: int, out_dir: Path | None,
              val_data: np.ndarray, rec: Recorder, template: torch.nn.Module,
              identity: dict) -> None:
    """All K stages reported their state after step ``done``: checkpoint and/or evaluate."""
    model_state, optims, gen_state = _assemble(cfg, parts)
    if out_dir is not None and cfg.checkpoint_every and (
            done % cfg.checkpoint_every == 0 or done == cfg.steps):
        save_state(out_dir, identity, done, model_state, optims, gen_state)
    if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
        template.load_state_dict(model_state)
        rec.log({"step": done - 1, "eval_bpb": bits_per_byte(evaluate(template, val_data,
                                                                         cfg))})


def _shutdown(procs: list, grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


def _finish_without_steps(cfg: RGCConfig, template: torch.nn.Module, out_dir: Path | None,
                          val_data: np.ndarray, rec: Recorder, start: int,
                          sampler: MemorySampler, corpus: str, name: str | None, seed: int,
                          identity: dict) -> TrainResult:
    """Resumed at the last step already: reload the checkpoint, re-evaluate, and write the
    summary from the recorded step times."""
    ck = load_state(out_dir, identity)
    if ck is not None:
        template.load_state_dict(ck["model"])
    eval_losses = evaluate(template, val_data, cfg)
    peak = sampler.stop()
    summary = rec.finish(cfg, make_summary(cfg, "async", name, corpus, seed, eval_losses, peak,
                                           template.num_parameters(), rec.records, start, 0.0),
                         eval_losses)
    return TrainResult("async", summary["tokens_per_s"], peak.rss, summary["final_bpb"],
                       eval_losses, summary, rec.records,
                       {n: v.clone() for n, v in template.state_dict().items()}, out_dir)
