"""One RGC run in a fresh process tree: the suite's way of running every run whose memory it
measures (docs/rgc.md, "Memory").

Run after run in one process, each run's tree has the parent of all: the allocations an earlier
run left in its allocator, the torch runtime state the earlier runs built up (thread pools, the
fork server and what it preloaded) and their pages. :func:`train_in_fresh_process` starts a new
interpreter (``spawn``) for the one run; the run (and, async, its fork server and workers) is
that interpreter's tree, and the parent reads back the summary the run wrote. The child calls
the same :func:`lmrepro.rgc.runner.train` with the same configuration, seed and data, so the
results are those of a run in the calling process (tested, bit for bit); its summary records
``details.process_tree`` (``root_pid``, ``launcher_pid``, ``fresh``).

The training data cross by reference when they are a file mapping (the pipeline's prepared
splits, :func:`lmrepro.rgc.wire.by_reference`), by value otherwise.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.results import read_run
from lmrepro.rgc.common import check_data
from lmrepro.rgc.config import RGCConfig, check_executor, check_threads
from lmrepro.rgc.wire import MappedBytes, by_reference, received


def _child(cfg: dict[str, Any], executor: str, data: dict[str, np.ndarray | MappedBytes | None],
           run_dir: str, corpus: str, name: str, seed: int, report: Any) -> None:
    """The fresh process: train the run into ``run_dir``; a failure goes back on ``report`` as
    the pickled exception (where it pickles) and its traceback."""
    from lmrepro.rgc.common import mark_fresh_process
    from lmrepro.rgc.runner import train

    try:
        mark_fresh_process()
        train(RGCConfig(**cfg), executor, received(data["train"]), received(data["val"]),
              run_dir, corpus, name, seed=seed, test_data=received(data["test"]))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        try:
            blob: bytes | None = pickle.dumps(exc)
            pickle.loads(blob)                   # an exception that cannot be rebuilt: text
        except Exception:  # noqa: BLE001
            blob = None
        report.put((blob, traceback.format_exc()))
        raise SystemExit(1) from None
    report.put(("ok",))


def train_in_fresh_process(config: RGCConfig, executor: str, train_data: np.ndarray,
                           val_data: np.ndarray, run_dir: str | Path, corpus: str, name: str,
                           seed: int = 0, test_data: np.ndarray | None = None
                           ) -> dict[str, Any]:
    """:func:`lmrepro.rgc.runner.train` of one run in a new interpreter (its own process tree);
    returns the run's summary (read from ``run_dir``). A failure in the child is raised here:
    the child's exception where it can be rebuilt, else a ``RuntimeError`` with its
    traceback."""
    # bad input is refused here, as train() would refuse it, before a process starts
    check_executor(executor)
    check_data("train_data", train_data, config.model.context)
    check_data("val_data", val_data, config.model.context)
    if test_data is not None:
        check_data("test_data", test_data, config.model.context)
    check_threads(config, executor)
    ctx = mp.get_context("spawn")
    report = ctx.SimpleQueue()
    cfg = {n: getattr(config, n) for n in RGCConfig.model_fields}
    data = {"train": by_reference(train_data), "val": by_reference(val_data),
            "test": None if test_data is None else by_reference(test_data)}
    proc = ctx.Process(target=_child, name=f"rgc-run-{name}",
                       args=(cfg, executor, data, str(run_dir), corpus, name, seed, report))
    proc.start()
    got = None                   # ("ok",) or (the pickled exception or None, its traceback)
    while got is None:           # read while it runs: a long report must not fill the pipe
        if not report.empty():
            got = report.get()
        elif not proc.is_alive():
            got = report.get() if not report.empty() else (None, "(no report: it died)")
        else:
            proc.join(timeout=0.2)
    proc.join()
    report.close()
    if got != ("ok",) or proc.exitcode != 0:
        blob, text = got if len(got) == 2 else (None, "(reported success)")
        if blob is not None:
            raise pickle.loads(blob)
        raise RuntimeError(f"RGC run {run_dir} ({executor}) failed in its own process "
                           f"(exit code {proc.exitcode}):\n{text}")
    return dict(read_run(run_dir)["summary"])
