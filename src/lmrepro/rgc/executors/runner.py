"""The entry point of one run: :func:`train` with the sync, async or backprop executor."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmrepro.errors import check
from lmrepro.rgc.config import RGCConfig, check_executor, check_threads
from lmrepro.rgc.core.corpus import check_data, synthetic_corpus
from lmrepro.rgc.executors.faults import check_fault_point
from lmrepro.rgc.core.result import TrainResult
from lmrepro.rgc.core.run_spec import RunSpec


def train(config: RGCConfig, executor: str = "sync", train_data: np.ndarray | None = None,
          val_data: np.ndarray | None = None, out_dir: str | Path | None = None,
          corpus: str = "synthetic", name: str | None = None, stop_after: int | None = None,
          seed: int = 0, test_data: np.ndarray | None = None) -> TrainResult:
    """Train with RGC (``"sync"``, ``"async"``) or the global-backprop baseline (``"backprop"``;
    ``"pipelined_backprop"``: the same, pipelined over the async executor's workers).

    Args:
        config: the run's :class:`RGCConfig`.
        executor: ``"sync"`` (one process, stages in turn), ``"async"`` (the stages on
            ``config.n_workers`` worker processes, ``config.placement``), ``"backprop"`` or
            ``"pipelined_backprop"`` (global backprop on the async executor's workers and
            placement, :mod:`lmrepro.rgc.executors.pipelined`).
        train_data, val_data: 1-D uint8 byte arrays; ``None`` uses a deterministic synthetic
            text (for smoke runs only).
        out_dir: run directory in the :mod:`lmrepro.results` layout; enables checkpoints
            (every ``config.checkpoint_every`` steps) and resume: a run directory with a
            checkpoint continues from it.
        corpus, name: recorded in ``summary.json`` (name defaults to ``rgc-<executor>`` or
            ``backprop``).
        stop_after: stop after this many steps (as if killed), leaving the checkpoint; no
            evaluation, no summary. For tests and time-boxed runs.
        seed: initialisation and batch order (the same for every executor).
        test_data: the test split (1-D uint8), scored at the end beside the validation split
            (``test_eval_losses.json``, ``details.final_test_bpb``); None: not scored.

    Returns:
        :class:`TrainResult` with ``tokens_per_s``, ``peak_rss_bytes``, ``final_bpb``,
        ``eval_losses`` (nats per fixed eval batch), ``summary`` and the final parameters.
    """
    check(isinstance(config, RGCConfig), "config", type(config).__name__,
          "must be an lmrepro.rgc.RGCConfig")
    check_executor(executor)
    check(stop_after is None or (isinstance(stop_after, int) and stop_after >= 0), "stop_after",
          stop_after, "must be None or an integer >= 0")
    check_fault_point(config, executor)       # a test's fault point that cannot fire
    if train_data is None or val_data is None:
        text = synthetic_corpus(200_000, seed=12345)
        split = int(0.9 * len(text))
        train_data = text[:split] if train_data is None else train_data
        val_data = text[split:] if val_data is None else val_data
    check_data("train_data", train_data, config.model.context)
    check_data("val_data", val_data, config.model.context)
    if test_data is not None:
        check_data("test_data", test_data, config.model.context)
    check_threads(config, executor)
    spec = RunSpec(executor, seed, corpus, name, Path(out_dir) if out_dir is not None else None,
                   stop_after, test_data)
    if executor == "async":
        from lmrepro.rgc.executors.async_ import train_async
        return train_async(config, spec, train_data, val_data)
    if executor == "pipelined_backprop":
        from lmrepro.rgc.executors.async_ import train_async
        from lmrepro.rgc.executors.pipelined import KIND, pipelined_config
        return train_async(pipelined_config(config), spec, train_data, val_data, KIND)
    if executor == "backprop":
        from lmrepro.rgc.executors.backprop import train_backprop_executor
        return train_backprop_executor(config, spec, train_data, val_data)
    from lmrepro.rgc.executors.sync import train_single_process
    return train_single_process(config, spec, train_data, val_data)
