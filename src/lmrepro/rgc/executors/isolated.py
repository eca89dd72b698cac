"""One RGC run in a fresh process tree: the suite's way of running every run whose memory it
measures (docs/rgc.md, "Memory").

Run after run in one process, each run's tree has the parent of all: the allocations an earlier
run left in its allocator, the torch runtime state the earlier runs built up (thread pools, the
fork server and what it preloaded) and their pages. :func:`train_in_fresh_process` starts a new
interpreter (``spawn``) for the one run; the run (and, async, its fork server and workers) is
that interpreter's tree, and the parent reads back the summary the run wrote. The child calls
the same :func:`lmrepro.rgc.executors.runner.train` with the same configuration, seed and data, so
the results are those of a run in the calling process (tested, bit for bit); its summary records
``details.process_tree`` (``root_pid``, ``launcher_pid``, ``fresh``).

The training data cross by reference when they are a file mapping (the pipeline's prepared
splits, :func:`lmrepro.rgc.executors.wire.by_reference`), by value otherwise.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.results import read_run
from lmrepro.rgc.config import RGCConfig, check_executor, check_threads
from lmrepro.rgc.core.corpus import check_data
from lmrepro.rgc.executors.wire import MappedBytes, by_reference, received


def _child(cfg: dict[str, Any], executor: str, data: dict[str, np.ndarray | MappedBytes | None],
           run_dir: str, corpus: str, name: str, seed: int, report: Any) -> None:
    """The fresh process: train the run into ``run_dir``; a failure goes back on ``report`` as
    its traceback, then the exception itself where the queue can carry it."""
    from lmrepro.lifetime import die_with_multiprocessing_parent
    from lmrepro.rgc.core.run_memory import mark_fresh_process
    from lmrepro.rgc.executors.runner import train

    # the run ends with the process that asked for it (a SIGKILLed stage leaves no writer)
    die_with_multiprocessing_parent()
    try:
        mark_fresh_process()
        train(RGCConfig(**cfg), executor, received(data["train"]), received(data["val"]),
              run_dir, corpus, name, seed=seed, test_data=received(data["test"]))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        report.put(("traceback", traceback.format_exc()))
        try:
            report.put(("exception", exc))
        except Exception:  # noqa: BLE001 - an exception the queue cannot carry: text only
            pass
        raise SystemExit(1) from None
    report.put(("ok",))


def _drain(report: Any, into: list[tuple[Any, ...]]) -> None:
    """Move what the child has put on ``report`` into ``into`` (a message that cannot be
    rebuilt here, such as an exception whose class needs other arguments, is dropped)."""
    while not report.empty():
        try:
            into.append(report.get())
        except Exception:  # noqa: BLE001
            continue


def _failure(messages: list[tuple[Any, ...]]) -> tuple[BaseException | None, str]:
    """A failed child's exception (None where it did not arrive) and its traceback."""
    exc, text = None, "(no report: it died)"
    for kind, *rest in messages:
        if kind == "traceback":
            text = rest[0]
        elif kind == "exception":
            exc = rest[0]
    return exc, text


def train_in_fresh_process(config: RGCConfig, executor: str, train_data: np.ndarray,
                           val_data: np.ndarray, run_dir: str | Path, corpus: str, name: str,
                           seed: int = 0, test_data: np.ndarray | None = None
                           ) -> dict[str, Any]:
    """:func:`lmrepro.rgc.executors.runner.train` of one run in a new interpreter (its own process
    tree); returns the run's summary (read from ``run_dir``). A failure in the child is raised here:
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
    messages: list[tuple[Any, ...]] = []
    while proc.is_alive():       # read while it runs: a long report must not fill the pipe
        _drain(report, messages)
        proc.join(timeout=0.2)
    proc.join()
    _drain(report, messages)
    report.close()
    if ("ok",) not in messages or proc.exitcode != 0:
        exc, text = _failure(messages)
        if exc is not None:
            raise exc
        raise RuntimeError(f"RGC run {run_dir} ({executor}) failed in its own process "
                           f"(exit code {proc.exitcode}):\n{text}")
    return dict(read_run(run_dir)["summary"])
