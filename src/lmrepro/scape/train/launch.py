"""Launch ``train-scape`` under torchrun from Python (notebooks, tests, the pipeline).

:func:`launch_train_scape` runs ``python -m torch.distributed.run --standalone --nproc-per-node N
-m lmrepro.scape.train.worker ...`` (the program of ``lmrepro train-scape``; torchrun taken from
this interpreter so it works inside a virtual environment without ``torchrun`` on ``PATH``) as a
subprocess in its own session, logs to ``OUT/launch.log`` and returns the run directory.
:func:`run_scape_suite` runs a list of runs of the SCAPE comparison (arXiv 2607.01678) on one
corpus (the ``scape:`` section's suite, or the learning-rate sweep's runs) with the same data,
seed and steps, skipping runs whose ``summary.json`` exists (a resumable pipeline: an
interrupted run also resumes from its last checkpoint).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lmrepro.errors import check
from lmrepro.lifetime import guarded_command
from lmrepro.model import ModelConfig
from lmrepro.results import SUMMARY
from lmrepro.scape.config import ScapeConfig, ScapeRun
from lmrepro.scape.train.worker import worker_argv

log = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """torchrun exited with a non-zero status; the message carries the log's tail."""


# the worker program (lmrepro.scape.train.worker): the same flags as `lmrepro train-scape`, without
# loading the other wings into every worker
ENTRY = ("-m", "lmrepro.scape.train.worker")


def torchrun_command(nproc: int, worker_args: Sequence[str], *, nnodes: int = 1,
                     node_rank: int = 0, rdzv_endpoint: str | None = None) -> list[str]:
    """The torchrun command line: standalone for one node, c10d rendezvous otherwise."""
    check(isinstance(nproc, int) and nproc >= 1, "world_size (nproc per node)", nproc,
          "must be an integer >= 1")
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd += ["--standalone"]
    else:
        check(rdzv_endpoint is not None, "rdzv_endpoint", rdzv_endpoint,
              "must be HOST:PORT for a multi-node launch")
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", str(rdzv_endpoint)]
    cmd += ["--nproc-per-node", str(nproc), *ENTRY, *worker_args]
    return cmd


@dataclass(frozen=True)
class Nodes:
    """Where this torchrun agent sits in a multi-node run: ``count`` nodes (agents), this one
    ``rank``, all meeting at the c10d rendezvous ``endpoint`` (``HOST:PORT``). The default,
    one node, is torchrun's ``--standalone``."""

    count: int = 1
    rank: int = 0
    endpoint: str | None = None


def launch_log(out_dir: str | os.PathLike, node_rank: int = 0) -> Path:
    """The torchrun log of node ``node_rank`` of a run (node 0's is ``launch.log``)."""
    return Path(out_dir) / ("launch.log" if node_rank == 0 else f"launch-node{node_rank}.log")


def launch_train_scape(corpus_dir: str | os.PathLike, out_dir: str | os.PathLike,
                       world_size: int, cfg: ScapeConfig, run: ScapeRun, model: ModelConfig,
                       *, seed: int = 0, corpus: str = "", timeout_s: float | None = None,
                       env: Mapping[str, str] | None = None, check_exit: bool = True,
                       nodes: Nodes = Nodes()) -> Path:
    """Run one ``train-scape`` job under torchrun with ``world_size`` workers on this node
    (``nodes``: this agent's place in a multi-node run, every node starting ``world_size``
    workers; all agents pass the same ``out_dir``, which global rank 0 writes).

    Output of this node's ranks goes to ``out_dir/launch.log`` (node 0; ``launch-node<r>.log``
    for the others). On a non-zero exit raises :class:`LaunchError` with the log's tail (unless
    ``check_exit`` is False); on ``timeout_s`` the whole process group is killed. Returns
    ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(world_size, worker_argv(cfg, run, model, str(corpus_dir), str(out),
                                                   seed, corpus),
                           nnodes=nodes.count, node_rank=nodes.rank,
                           rdzv_endpoint=nodes.endpoint)
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    log_path = launch_log(out, nodes.rank)
    with open(log_path, "ab") as log:
        log.write(("\n$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        # guarded: torchrun (own session) dies with this process (docs/reliability.md)
        proc = subprocess.Popen(guarded_command(cmd), stdout=log, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0 and check_exit:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise LaunchError(f"train-scape ({run.run_name}, {world_size} workers x {nodes.count} "
                          f"node(s), node {nodes.rank}) exited "
                          f"with status {rc}; see {log_path}. Last output:\n{tail}")
    return out


def run_scape_suite(corpus_dir: str | os.PathLike, out_root: str | os.PathLike,
                    cfg: ScapeConfig, runs: Sequence[ScapeRun], model: ModelConfig,
                    world_size: int = 2, *, seed: int = 0, corpus: str = "",
                    timeout_s: float | None = None) -> list[Path]:
    """Each run into ``out_root/<name>`` with the shared settings ``cfg``; runs with a
    ``summary.json`` are skipped (an interrupted one resumes from its last checkpoint).
    Returns the run directories in order."""
    out_root = Path(out_root)
    dirs: list[Path] = []
    for run in runs:
        out = out_root / run.run_name
        if not (out / SUMMARY).exists():
            t0 = time.perf_counter()
            launch_train_scape(corpus_dir, out, world_size, cfg, run, model, seed=seed,
                               corpus=corpus, timeout_s=timeout_s)
            # the terminal's log, not the report (lmrepro.pipeline.session routes logging)
            log.info("%s: finished in %.1f s -> %s", run.run_name, time.perf_counter() - t0, out)
        dirs.append(out)
    return dirs
