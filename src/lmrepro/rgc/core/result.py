"""The end of an RGC run (:func:`finish`): its final evaluation, its summary's fields and what
:func:`lmrepro.rgc.train` returns (:class:`TrainResult`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmrepro.evaluation import bits_per_byte
from lmrepro.harness import Run
from lmrepro.memory import Memory, memory_fields
from lmrepro.memory_phases import END
from lmrepro.model import ByteTransformer
from lmrepro.rgc.config import MULTI_PROCESS, RGCConfig
from lmrepro.rgc.core.recipe import evaluate
from lmrepro.rgc.roles import RGCMethod
from lmrepro.rgc.core.run_memory import attributed_peak, memory_details, set_phase
from lmrepro.rgc.core.run_spec import RunSpec


@dataclass
class TrainResult:
    """What :func:`lmrepro.rgc.train` returns.

    ``tokens_per_s`` counts training tokens over the training clock (start-up, checkpoint writes
    and evaluations excluded); ``peak_rss_bytes`` is the sampled peak RSS of the whole process
    tree (PSS and USS in the summary); ``final_bpb`` the last stage's readout in bits per byte
    on the fixed eval set (NaN for a run stopped early); ``eval_losses`` per batch, nats.
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
    #: async: every worker's compute events of this invocation (:mod:`lmrepro.rgc.executors.events`)
    events: list[Any] = field(default_factory=list, repr=False)


def finish(cfg: RGCConfig, spec: RunSpec, run: Run, model: ByteTransformer, val_data: np.ndarray,
           end: int, worker_runtimes: Memory | None = None) -> TrainResult:
    """The end of an invocation: ``model`` holds the final parameters. Stopped early
    (``end`` < steps): the result without evaluation or summary. Otherwise the final
    evaluation, ``eval_losses.json`` and ``summary.json``. From here on the sampler counts the
    end of run phase (:data:`ATTRIBUTED`)."""
    set_phase(run, END)
    final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if end < cfg.steps:
        return TrainResult(spec.executor, run.tokens_per_s(), attributed_peak(run).rss,
                           float("nan"), [], {}, run.records, final_state, spec.out_dir)
    eval_losses = evaluate(model, val_data, cfg)
    test_losses = None if spec.test_data is None else evaluate(model, spec.test_data, cfg)
    peak = attributed_peak(run)
    fields = summary_fields(cfg, spec, eval_losses, peak, model.num_parameters(),
                            run.sampler.max_processes, worker_runtimes)
    fields["details"]["final_test_bpb"] = (None if test_losses is None
                                           else bits_per_byte(test_losses))
    # by phase; the peaks that do not depend on sampling (lmrepro.memory, "Exact peaks")
    fields["details"].update(memory_details(run))
    summary = run.finish(run.summary(fields), eval_losses, cfg.eval_batch_size,
                         cfg.model.context, test_losses)
    return TrainResult(spec.executor, summary["tokens_per_s"], peak.rss, summary["final_bpb"],
                       eval_losses, summary, run.records, final_state, spec.out_dir)


def summary_fields(cfg: RGCConfig, spec: RunSpec, eval_losses: list[float], peak: Memory,
                   n_params: int, memory_processes: int = 1,
                   worker_runtimes: Memory | None = None) -> dict[str, Any]:
    """The run's :class:`RunSummary` fields the harness does not fill in (timing, tokens and
    resume are its own)."""
    is_async, is_rgc = spec.executor in MULTI_PROCESS, spec.method == RGCMethod.RGC
    threads = cfg.async_threads if is_async else cfg.single_process_threads
    return {
        "name": spec.name or (f"rgc-{spec.executor}" if is_rgc else
                              spec.executor.replace("_", "-")),
        "method": spec.method, "corpus": spec.corpus,
        "seed": spec.seed, "final_bpb": bits_per_byte(eval_losses),
        **memory_fields(peak), "n_params": n_params,
        "processes": cfg.n_workers if is_async else 1, "threads": threads,
        "details": {"executor": spec.executor,
                    "threads_per_process": list(cfg.worker_threads) if is_async
                    else [cfg.single_process_threads],
                    "placement": cfg.placement if is_async else [list(range(cfg.n_stages))],
                    "horizon": cfg.horizon if is_rgc else None,
                    "consensus_staleness": cfg.consensus_staleness if is_rgc else None,
                    # running ahead: steps by which each stage's gradients arrived late
                    "stage_gradient_delay": cfg.stage_gradient_delays if is_rgc else None,
                    "cores_declared": cfg.cores, "machine_cores": os.cpu_count(),
                    "oversubscribed": threads > (os.cpu_count() or 1),
                    "memory_processes": memory_processes,
                    # async: what the tree grew by when the workers had started, before any
                    # model or data existed in them (their torch runtimes, gloo included)
                    "worker_runtimes_memory": worker_runtimes.to_dict()
                    if worker_runtimes is not None else None},
        "config": run_config(cfg),
    }


def run_config(cfg: RGCConfig) -> dict[str, Any]:
    """The summary's ``config`` in every trainer's layout: ``model`` (the model's shape) and
    ``settings`` (the rest of the RGC configuration)."""
    settings = cfg.to_dict()
    return {"model": settings.pop("model"), "settings": settings}
