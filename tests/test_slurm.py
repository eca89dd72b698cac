"""``launcher: kind: slurm`` against a real SLURM on this machine (``bash scripts/slurm-local.sh
start``; CI's ``--all`` run starts it, a run without it skips these with the reason): the smoke
profile's SCAPE and RGC suites as jobs give the local runs' per-step losses byte for byte; a
cancelled job stops the stage with one line and the next run resumes it from its checkpoint to
the uninterrupted run's losses; a stage interrupted while its jobs are queued reattaches to them
instead of submitting them again."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from _dist_helpers import write_tiny_corpus
from lmrepro.io import read_json
from lmrepro.results import read_run

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]


def _partition() -> str | None:
    """The default partition of a running SLURM whose node is up, else None."""
    if shutil.which("sinfo") is None:
        return None
    out = subprocess.run(["sinfo", "--noheader", "--format=%P|%T"], capture_output=True,
                         text=True, timeout=30, check=False)
    for line in out.stdout.splitlines():
        part, _, state = line.partition("|")
        if part.endswith("*") and state.rstrip("*") in ("idle", "mixed", "allocated"):
            return part.rstrip("*")
    return None


@pytest.fixture(scope="module")
def partition() -> str:
    part = _partition()
    if part is None:
        pytest.skip("SLURM is not running here (start it with `bash scripts/slurm-local.sh "
                    "start`; CI's --all run does)")
    return part


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A prepared corpus ``tiny`` under a prepared-data folder the jobs can read."""
    root = tmp_path_factory.mktemp("prepared")
    os.rename(write_tiny_corpus(root / "build"), root / "tiny")
    return root


def _launcher(partition: str, **slurm):
    from lmrepro.cluster.config import LauncherConfig

    return LauncherConfig(kind="slurm", slurm={"partition": partition, "poll_s": 1.0, **slurm})


def _smoke():
    from lmrepro.pipeline.params import load_params

    return load_params("params.yaml", profile="smoke")


def _scape_suite(runs: int, **changes):
    params = _smoke()
    suite = params.scape.replace(corpus="tiny", runs=params.scape.runs[:runs], **changes)
    return suite, params.scape.model or params.model


def _losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_run(run_dir)["metrics"] if "loss" in r]


def test_scape_suite_as_jobs_equals_local(partition, prepared, tmp_path):
    from lmrepro.scape.stage import run_suite

    suite, model = _scape_suite(2)
    local = run_suite(suite, model, [0], prepared, tmp_path / "local")
    jobs = run_suite(suite, model, [0], prepared, tmp_path / "slurm",
                     launcher=_launcher(partition))
    assert sorted(local) == sorted(jobs) and len(jobs) == 2
    for label, run_dir in jobs.items():
        record = read_json(run_dir / "slurm_job.json")
        assert record["job_id"] and _losses(run_dir), label
        assert _losses(run_dir) == _losses(local[label]), label
        assert read_run(run_dir)["eval_losses"] == read_run(local[label])["eval_losses"]


def test_rgc_suite_as_jobs_equals_local(partition, prepared, tmp_path):
    from lmrepro.rgc.stage import run_suite

    rgc = _smoke().rgc.replace(corpora=["tiny"])
    local = run_suite(rgc, [0], prepared, tmp_path / "local")
    jobs = run_suite(rgc, [0], prepared, tmp_path / "slurm", launcher=_launcher(partition))
    assert sorted(local) == sorted(jobs) and len(jobs) == len(rgc.executors)
    for label, run_dir in jobs.items():
        assert (run_dir / "slurm_job.json").exists(), label
        assert _losses(run_dir) and _losses(run_dir) == _losses(local[label]), label


def test_cancelled_job_is_one_line_then_resumes_to_the_same_losses(partition, prepared,
                                                                    tmp_path):
    from lmrepro.cluster.jobs import JobFailed
    from lmrepro.scape.stage import run_suite

    suite, model = _scape_suite(1, steps=40, warmup_steps=4, checkpoint_every=5)
    reference = run_suite(suite, model, [0], prepared, tmp_path / "local")
    launcher = _launcher(partition)
    stage = tmp_path / "slurm"
    failure: list[BaseException] = []

    def stage_run() -> None:
        try:
            run_suite(suite, model, [0], prepared, stage, launcher=launcher)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=stage_run)
    thread.start()
    run_dir = stage / "runs" / "tiny" / "seed0" / suite.runs[0].run_name
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "latest.json").exists():
        assert time.monotonic() < deadline and thread.is_alive(), failure
        time.sleep(0.5)
    job_id = read_json(run_dir / "slurm_job.json")["job_id"]
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    thread.join(timeout=120)
    assert len(failure) == 1 and isinstance(failure[0], JobFailed), failure
    line = str(failure[0])
    assert "\n" not in line and f"SLURM job {job_id}" in line
    assert line.startswith(f"tiny/seed0/{suite.runs[0].run_name}:"), line
    assert "CANCELLED" in line            # the tail of its log says what happened

    done = run_suite(suite, model, [0], prepared, stage, launcher=launcher)
    resumed = done[next(iter(done))]
    assert read_json(resumed / "slurm_job.json")["job_id"] != job_id      # a new job
    assert "resuming" in (resumed / "launch.log").read_text()
    assert _losses(resumed) == _losses(reference[next(iter(reference))])


def test_interrupted_while_queued_reattaches_without_resubmitting(partition, prepared,
                                                                  tmp_path, monkeypatch,
                                                                  caplog):
    from lmrepro.cluster import jobs
    from lmrepro.scape.stage import run_suite

    suite, model = _scape_suite(3)
    launcher = _launcher(partition, max_running=1)     # two of the three wait in the queue
    stage = tmp_path / "slurm"
    real_wait = jobs._wait

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt     # Ctrl-C right after the submission

    monkeypatch.setattr(jobs, "_wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, model, [0], prepared, stage, launcher=launcher)
    root = stage / "runs" / "tiny" / "seed0"
    first = {r.run_name: read_json(root / r.run_name / "slurm_job.json")["job_id"]
             for r in suite.runs}
    states = jobs.queue_states()
    assert sum(states.get(j) == "PENDING" for j in first.values()) >= 1, states

    monkeypatch.setattr(jobs, "_wait", real_wait)
    caplog.set_level("INFO", logger="lmrepro.cluster.jobs")
    out = run_suite(suite, model, [0], prepared, stage, launcher=launcher)
    again = {Path(d).name: read_json(Path(d) / "slurm_job.json")["job_id"]
             for d in out.values()}
    assert again == first
    assert "submitted as SLURM job" not in caplog.text
    assert caplog.text.count("reattached to SLURM job") >= 2
    assert all((Path(d) / "summary.json").exists() for d in out.values())
    # finished runs are never submitted again
    caplog.clear()
    run_suite(suite, model, [0], prepared, stage, launcher=launcher)
    assert "SLURM job" not in caplog.text
