"""Launch ``train-scape`` under torchrun from Python (notebooks, tests, the pipeline).

:func:`launch_train_scape` runs ``python -m torch.distributed.run --standalone --nproc-per-node N
-m lmrepro train-scape ...`` (the same program as the ``torchrun`` script, taken from this
interpreter so it works inside a virtual environment without ``torchrun`` on ``PATH``) as a
subprocess in its own session, logs to ``OUT/launch.log`` and returns the run directory.
:func:`run_scape_suite` runs the comparison of the SCAPE paper (arXiv 2607.01678) on one corpus:
dense AdamW, dense AdamS, SCAPE 90 %, SCAPE 99 %, top-k + EF 99 %, with the same data, seeds and
steps, skipping runs whose ``summary.json`` exists (a resumable pipeline: an interrupted run also
resumes from its last checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from lmrepro.errors import ParameterError, check
from lmrepro.results import SUMMARY

DEFAULT_SUITE: list[dict[str, Any]] = [
    {"name": "adamw", "optimizer": "adamw", "sparsity": 0.0},
    {"name": "adams", "optimizer": "adams", "sparsity": 0.0},
    {"name": "scape90", "optimizer": "scape", "sparsity": 0.9},
    {"name": "scape99", "optimizer": "scape", "sparsity": 0.99},
    {"name": "topk99", "optimizer": "topk", "sparsity": 0.99},
]

# keys of a run dict that are not train-scape flags
_NOT_FLAGS = {"corpus_dir", "out"}


class LaunchError(RuntimeError):
    """torchrun exited with a non-zero status; the message carries the log's tail."""


# the worker program: the project CLI's train-scape subcommand
ENTRY = ("-m", "lmrepro", "train-scape")


def args_to_flags(args: Mapping[str, Any]) -> list[str]:
    """``{"batch_size": 8, "model": {...}, "resume": False}`` -> ``--batch-size 8 --model-json
    '{...}' --no-resume``."""
    flags: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        if key == "model":
            flags += ["--model-json", json.dumps(value, sort_keys=True)]
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if key == "resume":
                flags.append("--resume" if value else "--no-resume")
                continue
            raise ParameterError(key, value, "boolean flags other than resume are not supported")
        flags += [flag, str(value)]
    return flags


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


def launch_train_scape(corpus_dir: str | os.PathLike, out_dir: str | os.PathLike,
                       world_size: int, args: Mapping[str, Any], *,
                       timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                       check_exit: bool = True) -> Path:
    """Run one ``train-scape`` job under torchrun with ``world_size`` workers on this node.

    ``args`` are train-scape options as a dict (``optimizer``, ``sparsity``, ``steps``,
    ``batch_size``, ``lr``, ``model`` (dict), ...). Output of all ranks goes to
    ``out_dir/launch.log``. On a non-zero exit raises :class:`LaunchError` with the log's tail
    (unless ``check_exit`` is False); on ``timeout_s`` the whole process group is killed.
    Returns ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flags = args_to_flags({**dict(args), "corpus_dir": str(corpus_dir), "out": str(out)})
    cmd = torchrun_command(world_size, flags)
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    log_path = out / "launch.log"
    with open(log_path, "ab") as log:
        log.write(("\n$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0 and check_exit:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise LaunchError(f"train-scape ({args.get('optimizer')}, world {world_size}) exited "
                          f"with status {rc}; see {log_path}. Last output:\n{tail}")
    return out


SUITE_KEYS = ("world_size", "runs")


def suite_from_section(section: Mapping[str, Any], model: Mapping[str, Any], seed: int
                       ) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """``(runs, common, world_size)`` for :func:`run_scape_suite` from the ``scape:`` section of
    params.yaml, the (top-level or section) model and the seed. Every key of the section other
    than ``world_size`` and ``runs`` is a ``train-scape`` option of the same name (``corpus`` is
    the corpus name written into each summary; the caller still passes its prepared directory)."""
    section = dict(section)
    runs = [dict(r) for r in section.get("runs") or DEFAULT_SUITE]
    world = int(section.get("world_size", 2))
    common = {k: v for k, v in section.items() if k not in SUITE_KEYS}
    common["model"] = dict(common.get("model") or model)
    common.setdefault("seed", seed)
    return runs, common, world


def run_scape_suite(corpus_dir: str | os.PathLike, out_root: str | os.PathLike,
                    runs: Sequence[Mapping[str, Any]] | None = None, world_size: int = 2,
                    common: Mapping[str, Any] | None = None, *,
                    timeout_s: float | None = None) -> list[Path]:
    """Run each run dict (default :data:`DEFAULT_SUITE`) merged over ``common`` into
    ``out_root/<name>``; runs with a ``summary.json`` are skipped. Returns the run dirs in order.

    ``common`` holds the shared settings (``steps``, ``batch_size``, ``lr``, ``warmup``, ``seed``,
    ``model``, ``eval_batches``, ``checkpoint_every``, ...); a run dict overrides them and must
    have ``name`` and ``optimizer``.
    """
    runs = list(DEFAULT_SUITE if runs is None else runs)
    check(len(runs) > 0, "scape.runs", runs, "must list at least one run")
    names = [r.get("name") for r in runs]
    check(all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names),
          "scape.runs[].name", names, "every run needs a unique non-empty name")
    out_root = Path(out_root)
    dirs: list[Path] = []
    for run in runs:
        args = {**dict(common or {}), **dict(run)}
        out = out_root / str(run["name"])
        if (out / SUMMARY).exists():
            dirs.append(out)
            continue
        t0 = time.perf_counter()
        launch_train_scape(corpus_dir, out, world_size, args, timeout_s=timeout_s)
        print(f"{run['name']}: finished in {time.perf_counter() - t0:.1f} s -> {out}",
              flush=True)
        dirs.append(out)
    return dirs
