"""The job engine's decisions without a SLURM (tests/test_slurm.py runs them against one): which
runs are skipped, reattached or submitted; the sbatch options each launcher key becomes; the
one-line failure; a multi-node job's rendezvous from SLURM's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmrepro.cluster import jobs
from lmrepro.cluster.config import SlurmConfig
from lmrepro.cluster.nodes import rendezvous_port, slurm_nodes
from lmrepro.io import atomic_write_json


def _spec(root: Path, name: str, *, done: bool = False, job: str | None = None,
          nodes: int = 1) -> jobs.JobSpec:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    if done:
        (run_dir / "summary.json").write_text("{}")
    if job is not None:
        atomic_write_json(run_dir / jobs.JOB_RECORD, {"job_id": job, "folder": str(root)})
    return jobs.JobSpec(name, run_dir, print, nodes=nodes, cpus=2)


def test_done_skipped_live_reattached_the_rest_submitted(tmp_path, monkeypatch):
    specs = [_spec(tmp_path, "done", done=True, job="1"),
             _spec(tmp_path, "queued", job="2_0"), _spec(tmp_path, "running", job="2_1"),
             _spec(tmp_path, "cancelled", job="3"), _spec(tmp_path, "new")]
    monkeypatch.setattr(jobs, "queue_states", lambda: {"2_0": "PENDING", "2_1": "RUNNING",
                                                       "3": "CANCELLED", "9": "RUNNING"})
    submitted: list[str] = []
    waited: list[str] = []
    monkeypatch.setattr(jobs, "submit", lambda s, *_: submitted.extend(x.name for x in s))
    monkeypatch.setattr(jobs, "_wait", lambda s, *_: waited.extend(x.name for x in s))
    jobs.run_jobs(specs, SlurmConfig(partition="p"), tmp_path)
    assert submitted == ["cancelled", "new"]
    assert waited == ["queued", "running", "cancelled", "new"]

    def no_queue():
        raise AssertionError("nothing to do: the queue is not asked")

    monkeypatch.setattr(jobs, "queue_states", no_queue)
    jobs.run_jobs(specs[:1], SlurmConfig(partition="p"), tmp_path)


def test_each_key_becomes_its_sbatch_option(tmp_path):
    pytest.importorskip("submitit")
    slurm = SlurmConfig(partition="gpu", gpus_per_node=4, mem_gb=64, time_min=90,
                        account="proj", qos="high", sbatch={"constraint": "h100"},
                        max_running=3)
    p = jobs._executor(slurm, tmp_path, nodes=2, cpus=8).parameters
    assert (p["partition"], p["nodes"], p["ntasks_per_node"], p["cpus_per_task"]) == \
        ("gpu", 2, 1, 8)
    assert (p["gpus_per_node"], p["mem"], p["time"], p["account"], p["qos"]) == \
        (4, "64G", 90, "proj", "high")
    assert p["additional_parameters"] == {"constraint": "h100"}
    assert p["array_parallelism"] == 3
    assert jobs._executor(slurm.replace(cpus_per_node=16), tmp_path, 1, 8
                          ).parameters["cpus_per_task"] == 16


def test_failure_is_one_line_with_the_log_tail(tmp_path):
    spec = _spec(tmp_path, "seed0/adamw", job="7_1")
    (tmp_path / "7_1_0_log.err").write_text("Traceback\nslurmstepd: *** JOB 7 CANCELLED ***\n"
                                            "  boom\n\nLaunchError: status 1\nKilled\n")
    line = jobs.failure_line(spec, jobs.recorded_job(spec.run_dir))
    assert "\n" not in line
    assert line.startswith("seed0/adamw: SLURM job 7_1 ended without its results")
    # SLURM's verdict first, wherever it stands, then the last lines
    assert line.endswith("log " + str(tmp_path) + ": slurmstepd: *** JOB 7 CANCELLED *** | "
                         "boom | LaunchError: status 1 | Killed")


def test_rendezvous_from_slurm_environment():
    one = slurm_nodes({"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": "1234"})
    assert (one.count, one.rank, one.endpoint) == (1, 0, "localhost:21234")
    assert rendezvous_port("12_3") == rendezvous_port("12") == 20012
    assert rendezvous_port("45678") == 20000 + 45678 % 20000
