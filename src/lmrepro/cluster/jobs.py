"""A stage's runs as SLURM jobs, through submitit: submit, record, reattach, wait, report.

:func:`run_jobs` takes the stage's runs (:class:`JobSpec`: a run directory and the picklable
callable that trains it on every node of its job) and the ``launcher.slurm`` options. A run whose
directory holds its ``summary.json`` is done and never submitted again. Every submitted job's id
is recorded in its run directory (:data:`JOB_RECORD`), so that a stage run again after an
interruption (Ctrl-C, a lost login session) reattaches to its jobs still queued or running
instead of submitting them twice; the others go out together, one job array per shape (nodes,
CPUs), at most ``max_running`` at once. While it waits the stage logs each change of the counts
(queued, running, done, failed). A job that leaves the queue without its run's summary stops the
stage with one line (:class:`JobFailed`: the run, the job id, the tail of its log); the other
jobs go on, and the next run of the stage reattaches to them.

A job's state is read from ``squeue`` (what is queued or running) and its outcome from its run
directory, not from ``sacct``: a cluster without an accounting database works the same. A job
stopped at its time limit or preempted is requeued by submitit (:class:`Requeueable`) and its run
resumes from its own last checkpoint.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmrepro.cluster.config import SlurmConfig
from lmrepro.io import atomic_write_json, read_json
from lmrepro.results import SUMMARY

log = logging.getLogger(__name__)

#: the record of a run's SLURM job, in its run directory
JOB_RECORD = "slurm_job.json"
#: squeue states of a job that is still coming or going (anything else: it has left)
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED",
                         "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "STAGE_OUT",
                         "SIGNALING", "PREEMPTED"})


class JobFailed(RuntimeError):
    """A job ended without its run's results: one line, the run, the job id and its log's tail."""


class Requeueable:
    """A job's callable that submitit requeues when SLURM stops it at its time limit or preempts
    it (submitit's ``checkpoint`` protocol): the same call again, under the same job id, which
    resumes the run from the last checkpoint it saved itself."""

    def __call__(self) -> None:
        raise NotImplementedError

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


@dataclass(frozen=True)
class JobSpec:
    """One run as a job: its name in messages, its directory, what trains it (called once on
    each node of the job), the nodes it spans and the CPU cores it uses on each."""

    name: str
    run_dir: Path
    fn: Callable[[], Any]
    nodes: int = 1
    cpus: int = 1

    def done(self) -> bool:
        return (self.run_dir / SUMMARY).exists()


def queue_states(tries: int = 5, pause_s: float = 3.0) -> dict[str, str]:
    """Every job in the queue, array tasks one by one: ``{job id: state}``. A busy controller
    fails a query now and then (a timed-out or dropped connection): asked ``tries`` times."""
    for attempt in range(tries):
        out = subprocess.run(["squeue", "--noheader", "--array", "--format=%i|%T"],
                             capture_output=True, text=True, timeout=60, check=False)
        if out.returncode == 0:
            break
        if attempt + 1 == tries:
            raise JobFailed(f"squeue failed {tries} times (last status {out.returncode}: "
                            f"{out.stderr.strip()[-200:]!r}); is SLURM reachable from here?")
        time.sleep(pause_s)
    states = {}
    for line in out.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        states[job_id] = state
    return states


def recorded_job(run_dir: Path) -> dict[str, Any] | None:
    """The run's job record (:data:`JOB_RECORD`), if it has one."""
    path = run_dir / JOB_RECORD
    return read_json(path) if path.exists() else None


def log_tail(record: dict[str, Any], lines: int = 3) -> str:
    """The last lines of a job's error log (submitit's ``<id>_0_log.err``) on one line, SLURM's
    own verdict on the job first when it gave one (``*** JOB 12 ON node CANCELLED AT ... ***``:
    cancelled, time limit, preempted, node failure), wherever the job's processes' last words
    put it."""
    folder = Path(record["folder"])
    for suffix in ("err", "out"):
        path = folder / f"{record['job_id']}_0_log.{suffix}"
        if path.exists():
            text = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                    if ln.strip()]
            verdict = [ln for ln in text if "slurmstepd" in ln and "***" in ln][-1:]
            shown = verdict + [ln for ln in text[-lines:] if ln not in verdict]
            if shown:
                return " | ".join(shown)[-600:]
    return f"(no log in {folder})"


def failure_line(spec: JobSpec, record: dict[str, Any]) -> str:
    """The one line a failed job stops its stage with."""
    return (f"{spec.name}: SLURM job {record['job_id']} ended without its results "
            f"({spec.run_dir / SUMMARY} missing); log {record['folder']}: {log_tail(record)}")


def _executor(slurm: SlurmConfig, folder: Path, nodes: int, cpus: int) -> Any:
    import submitit

    ex = submitit.SlurmExecutor(folder=str(folder / "%j"), max_num_timeout=100)
    extra: dict[str, Any] = dict(slurm.sbatch)
    params: dict[str, Any] = {
        "partition": slurm.partition, "nodes": nodes, "ntasks_per_node": 1,
        "cpus_per_task": slurm.cpus_per_node or cpus, "time": slurm.time_min,
        "additional_parameters": extra}
    if slurm.gpus_per_node:
        params["gpus_per_node"] = slurm.gpus_per_node
    if slurm.mem_gb is not None:
        params["mem"] = f"{slurm.mem_gb}G"
    if slurm.account is not None:
        params["account"] = slurm.account
    if slurm.qos is not None:
        params["qos"] = slurm.qos
    if slurm.max_running:
        params["array_parallelism"] = slurm.max_running
    ex.update_parameters(**params)
    return ex


def submit(specs: Sequence[JobSpec], slurm: SlurmConfig, folder: Path) -> None:
    """Submit ``specs`` (one job array per shape) and record each job in its run directory."""
    shapes: dict[tuple[int, int], list[JobSpec]] = {}
    for spec in specs:
        shapes.setdefault((spec.nodes, spec.cpus), []).append(spec)
    for (nodes, cpus), group in shapes.items():
        ex = _executor(slurm, folder, nodes, cpus)
        with ex.batch():
            jobs = [ex.submit(spec.fn) for spec in group]
        for spec, job in zip(group, jobs, strict=True):
            spec.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(spec.run_dir / JOB_RECORD, {
                "job_id": str(job.job_id), "folder": str(job.paths.folder.resolve()),
                "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "nodes": nodes,
                "cpus_per_node": slurm.cpus_per_node or cpus})
            log.info("%s: submitted as SLURM job %s", spec.name, job.job_id)


def _counts(states: dict[str, str]) -> str:
    order = ("queued", "running", "done", "failed")
    return ", ".join(f"{sum(v == k for v in states.values())} {k}" for k in order)


def run_jobs(specs: Sequence[JobSpec], slurm: SlurmConfig, folder: str | os.PathLike,
             what: str = "runs") -> None:
    """Every run of ``specs`` done, as SLURM jobs: finished runs skipped, live jobs reattached,
    the rest submitted; waits, logging progress; :class:`JobFailed` for the first job that
    ended without its results (the others go on; the next call reattaches to them)."""
    todo = [s for s in specs if not s.done()]
    if not todo:
        return
    queue = queue_states()
    fresh, attached = [], []
    for spec in todo:
        record = recorded_job(spec.run_dir)
        if record is not None and queue.get(record["job_id"]) in LIVE_STATES:
            attached.append(spec)
            log.info("%s: reattached to SLURM job %s (%s)", spec.name, record["job_id"],
                     queue[record["job_id"]].lower())
        else:
            fresh.append(spec)
    if fresh:
        submit(fresh, slurm, Path(folder))
    log.info("%s: %d SLURM jobs (%d reattached, %d submitted), %d already done; logs under %s",
             what, len(todo), len(attached), len(fresh), len(specs) - len(todo), folder)
    try:
        _wait(todo, slurm.poll_s, what)
    except KeyboardInterrupt:
        log.warning("%s: interrupted; the SLURM jobs go on, and running the stage again "
                    "reattaches to them", what)
        raise


def _wait(specs: Sequence[JobSpec], poll_s: float, what: str) -> None:
    records = {s.name: recorded_job(s.run_dir) for s in specs}
    shown = ""
    while True:
        queue = queue_states()
        states: dict[str, str] = {}
        failed: JobSpec | None = None
        for spec in specs:
            record = records[spec.name]
            assert record is not None
            live = queue.get(record["job_id"])
            if spec.done():
                states[spec.name] = "done"
            elif live in LIVE_STATES:
                states[spec.name] = "queued" if live == "PENDING" else "running"
            else:
                states[spec.name] = "failed"
                failed = failed or spec
        line = _counts(states)
        if line != shown:
            log.info("%s: %s", what, line)
            shown = line
        if failed is not None:
            # a summary written just as the job left the queue: look once more
            time.sleep(1.0)
            if not failed.done():
                record = records[failed.name]
                assert record is not None
                raise JobFailed(failure_line(failed, record))
            continue
        if all(v == "done" for v in states.values()):
            return
        time.sleep(poll_s)
