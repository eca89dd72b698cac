"""Reliability under real faults (docs/reliability.md): one writer per run directory, processes that
end with their owner, resumes that always finish, no NaN in JSON, products with the umask, a full
disk and damaged files reported clearly, and strict parameter files.

Faults are real wherever the machine allows: processes are SIGKILLed (``os.kill``), the disk is a
256 KiB tmpfs, checkpoints are truncated on disk. Kills at a named place of a run's end use the
``LMREPRO_FAULT_AT`` fault points (:func:`lmrepro.lifetime.fault_point`), SIGKILL by default.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from lmrepro.errors import ParameterError
from lmrepro.io import (DamagedFileError, DiskFullError, NonFiniteError, append_jsonl,
                        atomic_torch_save, atomic_write_json, atomic_write_text, read_json,
                        read_jsonl)
from lmrepro.lifetime import FAULT_ENV, guarded_command, pid_alive, scratch_dir, sweep_scratch
from lmrepro.pipeline.params import load_params
from lmrepro.checkpoints import CheckpointError
from lmrepro.results import read_run, read_summary, truncate_metrics, write_summary
from lmrepro.rundirs import collect_runs, identity_key, prepare_runs_dir
from lmrepro.runlock import WRITER_LOCK, RunDirectoryBusy, writer_lock

from _runs import latest_checkpoint, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent
SRC = str(ROOT / "src")


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def wait_for(predicate, timeout: float, what: str, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gone_within(pids: list[int], timeout: float) -> float:
    """Seconds until every pid is gone (zombies count as gone); fails after ``timeout``."""
    t0 = time.monotonic()
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout, f"processes {pids} to end")
    return time.monotonic() - t0


def children_of(pid: int) -> list[int]:
    import psutil
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# ------------------------------------------------------------------------------------------------
# one writer per run directory
# ------------------------------------------------------------------------------------------------

HOLD = textwrap.dedent("""
    import sys, time
    from lmrepro.runlock import writer_lock
    with writer_lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(120)
""")


def hold_lock(directory: Path) -> subprocess.Popen:
    proc = subprocess.Popen([PY, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True,
                            env=env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_writer_stops_at_once_naming_the_directory_and_the_pid(tmp_path):
    run = tmp_path / "run"
    holder = hold_lock(run)
    try:
        t0 = time.monotonic()
        with pytest.raises(RunDirectoryBusy) as info, writer_lock(run):
            pass
        assert time.monotonic() - t0 < 2.0            # at once, not after a timeout
        message = str(info.value)
        assert str(run) in message and f"PID {holder.pid}" in message
        assert "one writer per run directory" in message
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_killed_process_is_taken_over_and_released_empty(tmp_path, caplog):
    run = tmp_path / "run"
    holder = hold_lock(run)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert json.loads((run / WRITER_LOCK).read_text())["pid"] == holder.pid   # stale record
    with writer_lock(run):
        assert json.loads((run / WRITER_LOCK).read_text())["pid"] == os.getpid()
        with writer_lock(run):                         # re-entrant in one process
            pass
        assert json.loads((run / WRITER_LOCK).read_text())["pid"] == os.getpid()
    assert f"PID {holder.pid}" in caplog.text and "took over" in caplog.text
    assert (run / WRITER_LOCK).read_text() == ""       # released: stable for DVC's hashes
    with writer_lock(run):                             # and free again
        pass


RGC_SLOW = textwrap.dedent("""
    import json, sys, numpy as np, torch
    torch.set_num_threads(1)
    from lmrepro.rgc import RGCConfig, train
    text = (b"It is a truth universally acknowledged, that a single man " * 200)
    data = np.frombuffer(text, dtype=np.uint8).copy()
    train(RGCConfig(**json.loads(sys.argv[2])), "sync", data[:8000], data[8000:], sys.argv[1])
""")

TINY_MODEL = dict(n_layers=2, d_model=16, n_heads=2, context=16)
TINY_RGC = dict(model=TINY_MODEL, n_stages=2, horizon=1,
                batch_size=4, micro_batches=2, warmup_steps=1, lr=3e-3, eval_batch_size=4,
                eval_batches=2, stages_per_worker=[1, 1], threads=[1, 1],
                backprop_threads=1, cores=2)


def test_a_second_trainer_on_a_running_run_directory_is_refused(tmp_path):
    from lmrepro.rgc import RGCConfig, train

    run = tmp_path / "run"
    cfg = {**TINY_RGC, "steps": 100_000, "checkpoint_every": 0}
    first = subprocess.Popen([PY, "-c", RGC_SLOW, str(run), json.dumps(cfg)], env=env())
    try:
        wait_for(lambda: (run / "metrics.jsonl").exists()
                 and (run / "metrics.jsonl").stat().st_size > 0, 60, "the first run to train")
        size = (run / "metrics.jsonl").stat().st_size
        text = np.frombuffer(b"abcdefgh" * 2000, dtype=np.uint8).copy()
        with pytest.raises(RunDirectoryBusy, match=f"PID {first.pid}"):   # stop_after: no hang
            train(RGCConfig(**cfg), "sync", text[:8000], text[8000:], run, stop_after=1)
        # the refused writer touched nothing: the first one's log kept growing, never truncated
        assert (run / "metrics.jsonl").stat().st_size >= size and first.poll() is None
    finally:
        first.kill()
        first.wait()


def test_runs_are_kept_by_identity_never_deleted_and_never_moved_under_a_live_writer(tmp_path):
    runs = tmp_path / "runs"
    prepare_runs_dir(runs, {"lr": 1})
    (runs / "c" / "a").mkdir(parents=True)
    (runs / "c" / "a" / "summary.json").write_text("{}")
    holder = hold_lock(runs / "c" / "a")
    try:
        with pytest.raises(RunDirectoryBusy, match=f"PID {holder.pid}"):
            prepare_runs_dir(runs, {"lr": 2})           # another identity, but a live writer
        assert (runs / "c" / "a" / "summary.json").exists()
    finally:
        holder.kill()
        holder.wait()
    prepare_runs_dir(runs, {"lr": 2})
    kept = tmp_path / f"runs.kept-{identity_key({'lr': 1})}"
    assert (kept / "c" / "a" / "summary.json").read_text() == "{}"
    assert json.loads((runs / "identity.json").read_text()) == {"lr": 2}
    assert not list(runs.rglob("summary.json"))        # no run of lr 1 is reused for lr 2
    prepare_runs_dir(runs, {"lr": 2})                   # same identity: kept in place
    (runs / "b").mkdir()
    (runs / "b" / "summary.json").write_text('{"lr": 2}')
    # back to lr 1: its runs come back, the lr 2 runs are kept in turn (a profile switched
    # back and forth trains nothing again)
    prepare_runs_dir(runs, {"lr": 1})
    assert (runs / "c" / "a" / "summary.json").read_text() == "{}" and not kept.exists()
    assert (tmp_path / f"runs.kept-{identity_key({'lr': 2})}" / "b" / "summary.json").exists()
    assert collect_runs(tmp_path) == {"runs/c/a": runs / "c" / "a"}   # nothing set aside
    # a folder whose identity is unknown goes stale, with a distinct name each time
    (runs / "identity.json").unlink()
    prepare_runs_dir(runs, {"lr": 3})
    (runs / "x").mkdir()
    (runs / "identity.json").write_text("not json")
    prepare_runs_dir(runs, {"lr": 3})
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("runs.stale-")]) == 2


def test_a_failed_data_check_moves_nothing(tmp_path):
    """Every check runs before prepare_runs_dir: a context longer than the validation split
    leaves the previous runs where they were (not moved aside, not deleted)."""
    from _dist_helpers import write_tiny_corpus
    from lmrepro.rgc.config import RGCSuite
    from lmrepro.rgc.stage import run_suite

    corpus = Path(write_tiny_corpus(tmp_path / "prepared_src"))
    prepared = tmp_path / "prepared"
    shutil.copytree(corpus, prepared / "tiny")
    stage = tmp_path / "stage"
    (stage / "runs" / "tiny" / "rgc-sync").mkdir(parents=True)
    (stage / "runs" / "tiny" / "rgc-sync" / "summary.json").write_text("{}")
    (stage / "runs" / "identity.json").write_text("{}")
    val_bytes = (prepared / "tiny" / "val.bin").stat().st_size
    suite = RGCSuite(**{**TINY_RGC, "model": {**TINY_MODEL, "context": val_bytes + 10},
                        "steps": 2, "corpora": ["tiny"], "executors": ["sync"]})
    with pytest.raises(ParameterError, match="tiny val split"):
        run_suite(suite, 0, prepared, stage)
    assert (stage / "runs" / "tiny" / "rgc-sync" / "summary.json").read_text() == "{}"
    assert not [p for p in (tmp_path / "stage").iterdir() if p.name.startswith("runs.")]


# ------------------------------------------------------------------------------------------------
# processes end with their owner
# ------------------------------------------------------------------------------------------------

OWNER = textwrap.dedent("""
    import subprocess, sys, time
    from lmrepro.lifetime import guarded_command
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    # in its own session, as torchrun is started
    child = subprocess.Popen(guarded_command(sleeper), start_new_session=True)
    print(child.pid, flush=True)
    child.wait()
""")


def test_a_guarded_command_in_its_own_session_dies_with_its_starter():
    owner = subprocess.Popen([PY, "-c", OWNER], stdout=subprocess.PIPE, text=True, env=env())
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    time.sleep(0.5)
    assert pid_alive(child)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert gone_within([child], 5.0) < 5.0


def test_the_exec_wrapper_refuses_to_start_when_its_parent_already_died():
    # --parent names a process that is not our parent: the wrapper behaves as if the real one had
    # died between fork and exec, and kills the command before it starts
    t0 = time.monotonic()
    proc = subprocess.run(guarded_command(["sleep", "30"])[:4] + ["1", "--", "sleep", "30"],
                          env=env(), timeout=20)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 10


TORCHRUN_WORKER = textwrap.dedent("""
    import os, sys, time
    from lmrepro.lifetime import die_with_torchrun_agent
    assert die_with_torchrun_agent()
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    time.sleep(300)
""")


def test_torchrun_workers_die_with_their_agent(tmp_path):
    """torch elastic starts each worker in a session of its own: a SIGKILL of the agent reaches
    none of them but through their parent-death signal."""
    (tmp_path / "worker.py").write_text(TORCHRUN_WORKER)
    (tmp_path / "pids").mkdir()
    agent = subprocess.Popen([PY, "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", "2", str(tmp_path / "worker.py"),
                              str(tmp_path / "pids")], env=env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        workers = wait_for(lambda: [int(p.name) for p in (tmp_path / "pids").iterdir()]
                           if len(list((tmp_path / "pids").iterdir())) == 2 else None, 120,
                           "two workers")
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        assert gone_within(workers, 5.0) < 5.0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


MP_OWNER = textwrap.dedent("""
    import multiprocessing as mp, sys, time

    def stage():
        from lmrepro.lifetime import die_with_multiprocessing_parent
        die_with_multiprocessing_parent()
        time.sleep(300)

    if __name__ == "__main__":
        ctx = mp.get_context("forkserver")
        procs = [ctx.Process(target=stage, daemon=True) for _ in range(2)]
        for p in procs:
            p.start()
        print(" ".join(str(p.pid) for p in procs), flush=True)
        time.sleep(300)
""")


def test_forkserver_workers_die_with_the_process_that_started_them(tmp_path):
    """The RGC async executor's case: the OS parent of a stage worker is the fork server, which
    outlives the run while any worker lives; the workers watch the run's process instead."""
    script = tmp_path / "owner.py"
    script.write_text(MP_OWNER)
    owner = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE, text=True, env=env())
    assert owner.stdout is not None
    workers = [int(p) for p in owner.stdout.readline().split()]
    time.sleep(1.0)
    helpers = [p for p in children_of(owner.pid) if p not in workers]   # the fork server
    assert all(pid_alive(p) for p in workers)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert gone_within(workers + helpers, 10.0) < 10.0


def test_a_report_kernel_is_killed_when_its_runner_ends_and_only_then():
    """``die_with_report_runner``: with ``$LMREPRO_RUNNER_PID`` set, the process is SIGKILLed
    when that process ends (the kernel of a killed ``lmrepro notebook``: ipykernel's own poller
    would let it exit normally up to a second later); without it, nothing is armed."""
    from lmrepro.lifetime import RUNNER_PID_ENV

    code = ("import sys, time\nfrom lmrepro.lifetime import die_with_report_runner\n"
            "print(die_with_report_runner(), flush=True)\ntime.sleep(float(sys.argv[1]))")
    runner = subprocess.Popen(["sleep", "300"])
    kernel = subprocess.Popen([PY, "-c", code, "60"], stdout=subprocess.PIPE, text=True,
                              env=env(**{RUNNER_PID_ENV: str(runner.pid)}))
    assert kernel.stdout is not None and kernel.stdout.readline().strip() == str(runner.pid)
    assert kernel.poll() is None                          # armed, not fired
    runner.kill()
    runner.wait()
    assert kernel.wait(timeout=30) == -signal.SIGKILL     # killed, not the 60 s sleep's end
    plain = subprocess.run([PY, "-c", code, "0"], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in env().items() if k != RUNNER_PID_ENV})
    assert plain.returncode == 0 and plain.stdout.strip() == "None"


def test_the_runner_binds_its_kernel_before_any_cell(tmp_path):
    """``lmrepro notebook`` has the kernel arm the watchdog on the runner before the first cell,
    whatever the notebook holds: the watchdog thread on the runner's PID is there."""
    from lmrepro.pipeline.notebook import run_notebook

    nb = _notebook(tmp_path / "bound.ipynb", textwrap.dedent("""\
        import os, threading
        from lmrepro.lifetime import RUNNER_PID_ENV
        runner = os.environ[RUNNER_PID_ENV]
        assert runner != str(os.getpid())
        names = [t.name for t in threading.enumerate()]
        assert f"lmrepro-exit-with-{runner}" in names, names"""))
    run_notebook(nb, tmp_path / "reports", cwd=tmp_path)    # raises if a cell's assert fails


STAGE_PROCESS = textwrap.dedent("""
    import pathlib, subprocess, sys, time
    from lmrepro.lifetime import bind_to_pipeline
    owners = bind_to_pipeline()
    # a busy child in a session of its own, like the kernel: it must not wait for a shutdown
    kernel = subprocess.Popen(["sleep", "300"], start_new_session=True)
    print(" ".join(map(str, owners)), kernel.pid, flush=True)
    try:
        time.sleep(300)
    finally:
        pathlib.Path(sys.argv[1]).write_text("cleaned up")
""")

FAKE_DVC = textwrap.dedent("""
    import os, shlex, subprocess, sys
    # as dvc runs a stage: `$SHELL -c CMD` with DVC_STAGE set, waited for in this thread
    shell, script, marker, tail = sys.argv[1:5]
    code = " ".join(shlex.quote(a) for a in (sys.executable, script, marker)) + tail
    subprocess.run([shell, "-c", code], env=dict(os.environ, DVC_STAGE="train_x"))
""")


@pytest.mark.parametrize("shell,tail", [("bash", ""), ("sh", "; true"), ("bash", "; true")],
                         ids=["bash-execs", "sh-waits", "bash-waits"])
def test_a_stage_process_ends_with_dvc_and_cleans_up(tmp_path, shell, tail):
    """SIGKILL of "dvc" (a stand-in that runs the command as dvc does, through a shell that
    execs it or waits for it) ends the stage process by SIGTERM, so its clean-up runs."""
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    marker, script = tmp_path / "marker", tmp_path / "stage.py"
    script.write_text(STAGE_PROCESS)
    dvc = subprocess.Popen([PY, "-c", FAKE_DVC, shutil.which(shell), str(script), str(marker),
                            tail], stdout=subprocess.PIPE, text=True, env=env())
    assert dvc.stdout is not None
    *owners, kernel = [int(p) for p in dvc.stdout.readline().split()]
    assert dvc.pid in owners                       # dvc itself is watched, not only the shell
    stage = wait_for(lambda: [p for p in children_of(dvc.pid) if p not in owners], 10,
                     "the stage process")
    assert kernel in stage and pid_alive(kernel)
    os.kill(dvc.pid, signal.SIGKILL)
    dvc.wait()
    assert gone_within(stage, 5.0) < 5.0          # the stage process and its busy "kernel"
    # the clean-up runs after they are gone; on a loaded 2-core machine it took over 5 s once
    assert wait_for(lambda: marker.exists(), 20, "the clean-up") and \
        marker.read_text() == "cleaned up"


def test_outside_dvc_a_stage_process_keeps_the_usual_rules(monkeypatch):
    from lmrepro.lifetime import bind_to_pipeline

    monkeypatch.delenv("DVC_STAGE", raising=False)
    assert bind_to_pipeline() == []


SCRATCH = textwrap.dedent("""
    import sys, time
    from lmrepro.lifetime import scratch_dir
    with scratch_dir("test", sys.argv[1]) as d:
        print(d, flush=True)
        time.sleep(300)
""")


def test_scratch_directory_of_a_killed_process_is_removed_by_the_next(tmp_path):
    proc = subprocess.Popen([PY, "-c", SCRATCH, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, env=env())
    assert proc.stdout is not None
    left = Path(proc.stdout.readline().strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert left.is_dir()                               # SIGKILL: no clean-up could run
    with scratch_dir("test", tmp_path) as mine:
        assert not left.exists() and mine.is_dir()
        assert sweep_scratch("test", tmp_path) == []   # a live one (ours) is kept
    assert not mine.exists()


# ------------------------------------------------------------------------------------------------
# fault points: the one way a test injects a fault, off unless armed
# ------------------------------------------------------------------------------------------------

FAULT = "from lmrepro.lifetime import fault_point; fault_point('here'); print('passed')"


@pytest.mark.parametrize("spec, returncode, out", [
    (None, 0, "passed"), ("elsewhere", 0, "passed"), ("here", -signal.SIGKILL, ""),
    ("here=kill", -signal.SIGKILL, ""), ("here=exit", 3, ""), ("here=raise", 1, ""),
])
def test_a_fault_point_acts_only_when_a_test_arms_it(spec, returncode, out):
    environ = {k: v for k, v in env().items() if k != FAULT_ENV}
    if spec is not None:
        environ[FAULT_ENV] = spec
    proc = subprocess.run([PY, "-c", FAULT], env=environ, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == returncode and proc.stdout.strip() == out, proc.stderr
    if spec == "here=raise":
        assert "InjectedFault: injected fault at here" in proc.stderr


def test_fault_points_are_parsed_and_flag_points_ignore_the_action(monkeypatch):
    from lmrepro.lifetime import armed_fault, fault_armed, fault_point

    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert armed_fault() is None and not fault_armed("scape-nan-loss@3:rank0")
    fault_point("anything")                                         # unarmed: nothing happens
    monkeypatch.setenv(FAULT_ENV, "scape-nan-loss@3:rank0")
    assert armed_fault() == ("scape-nan-loss@3:rank0", "kill") and fault_armed(
        "scape-nan-loss@3:rank0") and not fault_armed("scape-nan-loss@3:rank1")
    monkeypatch.setenv(FAULT_ENV, "rgc-stage2-backward@1=hang")
    assert armed_fault() == ("rgc-stage2-backward@1", "hang")
    monkeypatch.setenv(FAULT_ENV, "replace:a=b.json")               # "=" in a point's name
    assert armed_fault() == ("replace:a=b.json", "kill")


def test_no_other_fault_mechanism_in_the_package():
    """Only :mod:`lmrepro.lifetime` reads the fault variable; no public function takes a
    ``fault`` argument."""
    import inspect

    from lmrepro.rgc import train

    readers = [p.relative_to(ROOT).as_posix() for p in (ROOT / "src" / "lmrepro").rglob("*.py")
               if "LMREPRO_FAULT" in p.read_text(encoding="utf-8")]
    assert readers == ["src/lmrepro/lifetime.py"]
    assert "fault" not in inspect.signature(train).parameters


# ------------------------------------------------------------------------------------------------
# files: umask permissions, finite JSON, full disk, damaged files
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_products_are_written_with_the_process_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        atomic_write_text(tmp_path / "b.csv", "x\n")
        atomic_torch_save({"x": 1}, tmp_path / "c.pt")
        append_jsonl(tmp_path / "d.jsonl", {"x": 1})
        with writer_lock(tmp_path / "run"):
            pass
    finally:
        os.umask(old)
    for path in (tmp_path / "a.json", tmp_path / "b.csv", tmp_path / "c.pt",
                 tmp_path / "d.jsonl", tmp_path / "run" / WRITER_LOCK):
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path.name


def test_nan_and_infinity_are_never_written_to_json(tmp_path):
    with pytest.raises(NonFiniteError, match=r"a\.json at x\.y\[1\]"):
        atomic_write_json(tmp_path / "a.json", {"x": {"y": [1.0, float("nan")]}})
    with pytest.raises(NonFiniteError, match="loss"):
        append_jsonl(tmp_path / "m.jsonl", {"step": 0, "loss": float("inf")})
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "m.jsonl").exists()
    assert not list(tmp_path.iterdir())                # no temporary file left either
    (tmp_path / "old.json").write_text('{"tokens_per_s": NaN}')
    with pytest.raises(NonFiniteError, match="old.json holds NaN"):
        read_json(tmp_path / "old.json")


def test_a_diverged_eval_batch_is_written_as_a_name_not_as_nan(tmp_path):
    from lmrepro.results import EVAL_LOSSES, write_eval_losses

    write_eval_losses(tmp_path, [2.5, float("nan"), float("inf")], batch_size=4, context=8)
    text = (tmp_path / EVAL_LOSSES).read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert read_json(tmp_path / EVAL_LOSSES)["losses"] == [2.5, "nan", "inf"]   # strict reader
    losses = [float(x) for x in read_json(tmp_path / EVAL_LOSSES)["losses"]]
    assert losses[0] == 2.5 and np.isnan(losses[1]) and losses[2] == float("inf")


def test_a_summary_with_nan_is_refused_naming_the_field_and_not_written(tmp_path):
    summary = dict(name="r", method="rgc", corpus="c", seed=0, steps=6, tokens=10,
                   final_bpb=5.0, tokens_per_s=float("nan"), mean_step_time_s=0.1,
                   train_time_s=0.6, peak_rss_bytes=1, n_params=1, processes=1, threads=1)
    with pytest.raises(ParameterError, match="summary.tokens_per_s"):
        write_summary(tmp_path, summary)
    assert not (tmp_path / "summary.json").exists()
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "tokens_per_s": 0.0}))
    with pytest.raises(ParameterError, match=r"move .* aside.*summary.tokens_per_s = 0.0"):
        read_summary(tmp_path)


def test_a_metrics_line_cut_short_is_dropped_on_resume_and_an_error_elsewhere(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.9}\n{"step": 2, "lo')
    with pytest.raises(DamagedFileError, match=r"metrics.jsonl:3"):
        read_jsonl(path)
    assert truncate_metrics(tmp_path, 5) == [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.9}]
    assert read_jsonl(path) == [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.9}]


def _tiny_tmpfs_command(directory: Path) -> list[str] | None:
    """A command prefix that runs its command with a 256 KiB tmpfs mounted on ``directory``:
    directly as root, else in a user namespace; None where neither is possible here."""
    mount = f"mount -t tmpfs -o size=256k tmpfs {directory}"
    candidates = []
    if shutil.which("unshare"):
        candidates.append(["unshare", "--user", "--map-root-user", "--mount"])
        if os.geteuid() == 0:
            candidates.append(["unshare", "--mount"])
    for prefix in candidates:
        probe = subprocess.run([*prefix, "sh", "-c", f"{mount} && echo ok"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and "ok" in probe.stdout:
            return [*prefix, "sh", "-c", f'{mount} && exec "$@"', "sh"]
    return None


FILL = textwrap.dedent("""
    import os, sys, torch
    from lmrepro.io import DiskFullError, atomic_torch_save, atomic_write_text
    target = os.path.join(sys.argv[1], "run", "rank0.pt")
    atomic_write_text(target, "the previous checkpoint")
    try:
        atomic_torch_save({"w": torch.zeros(200_000)}, target)   # 800 KB into 256 KiB
    except DiskFullError as err:
        print("ERROR", err)
    print("LEFT", sorted(os.listdir(os.path.dirname(target))))
    print("KEPT", open(target).read())
""")


def test_a_really_full_disk_says_no_space_left_and_the_path(tmp_path):
    """A real full file system (a 256 KiB tmpfs): the error says so and names the file; the
    partial temporary file is removed and the previous file is intact."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    prefix = _tiny_tmpfs_command(mnt)
    if prefix is None:
        pytest.skip("cannot mount a tmpfs here (no root, no user namespaces); the simulated "
                    "ENOSPC test covers the message")
    out = subprocess.run([*prefix, PY, "-c", FILL, str(mnt)], capture_output=True, text=True,
                         env=env(), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    target = mnt / "run" / "rank0.pt"
    assert f"ERROR no space left on device writing {target}" in out.stdout, out.stdout
    assert "LEFT ['rank0.pt']" in out.stdout           # no temporary file left behind
    assert "KEPT the previous checkpoint" in out.stdout


def test_a_full_disk_from_the_command_line_is_one_line(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    prefix = _tiny_tmpfs_command(mnt)
    if prefix is None:
        pytest.skip("cannot mount a tmpfs here")
    data = np.frombuffer(b"the cat sat on the mat. " * 400, dtype=np.uint8)
    data[:8000].tofile(tmp_path / "train.bin")
    data[8000:].tofile(tmp_path / "val.bin")
    cfg = json.dumps({**TINY_RGC, "model": {**TINY_MODEL, "d_model": 64}, "steps": 3,
                      "checkpoint_every": 1})
    out = subprocess.run([*prefix, PY, "-m", "lmrepro", "train-rgc", "--executor", "sync",
                          "--out", str(mnt / "run"), "--train-file", str(tmp_path / "train.bin"),
                          "--val-file", str(tmp_path / "val.bin"), "--config-json", cfg],
                         capture_output=True, text=True, env=env(), timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("lmrepro: error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "no space left on device writing " + str(mnt / "run") in errors[0]


def test_a_full_disk_is_reported_even_when_torch_wraps_it(tmp_path, monkeypatch):
    """Simulated ENOSPC (for machines where no tmpfs can be mounted): the error raised inside
    torch.save's writer, as torch reports it, in a RuntimeError with the OSError chained."""
    import lmrepro.io as lio

    (tmp_path / "x.pt").write_text("previous")
    real_fsync = os.fsync

    def full(fd):
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as err:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") \
                from err

    monkeypatch.setattr(lio.os, "fsync", full)
    with pytest.raises(DiskFullError,
                       match=re.escape(f"no space left on device writing {tmp_path / 'x.pt'}")):
        atomic_torch_save({"w": 1}, tmp_path / "x.pt")
    monkeypatch.setattr(lio.os, "fsync", real_fsync)
    assert (tmp_path / "x.pt").read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["x.pt"]


def _baseline_run(out: Path, steps: int = 6, **kw):
    from lmrepro.baseline.config import BaselineConfig
    from lmrepro.baseline.trainer import train_single
    from lmrepro.model import ModelConfig

    data = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 600, dtype=np.uint8)
    settings = BaselineConfig(**{**dict(steps=steps, batch_size=4, lr=3e-3, warmup_steps=1,
                                        eval_every=steps, eval_batches=2, eval_batch_size=4,
                                        checkpoint_every=2, log_every=1, threads=1), **kw})
    return train_single(ModelConfig(n_layers=1, d_model=16, n_heads=2, context=16), settings,
                        data[:20000], data[20000:], out, progress=False)


def test_a_damaged_checkpoint_names_the_file_and_how_to_start_over(tmp_path):
    run = tmp_path / "run"
    _baseline_run(run, steps=4)
    (run / "summary.json").unlink()                       # as if killed before the end
    latest = latest_checkpoint(run)
    rank0 = run / "checkpoints" / latest["dir"] / "rank0.pt"
    rank0.write_bytes(rank0.read_bytes()[: rank0.stat().st_size // 2])     # truncated
    with pytest.raises(CheckpointError) as info:
        _baseline_run(run, steps=4)
    message = str(info.value)
    assert str(rank0) in message and "damaged" in message
    assert f"mv {run} {run}.damaged" in message and "\n" not in message
    (run / "checkpoints" / "latest.json").write_text('{"step": 4, "dir"')    # cut short
    with pytest.raises(CheckpointError, match=r"latest.json.*damaged.*mv "):
        _baseline_run(run, steps=4)


# ------------------------------------------------------------------------------------------------
# a resume with nothing (or little) left to train always finishes: kills at each phase of a run's
# end, for each trainer, then a resume; the result equals the uninterrupted run's
# ------------------------------------------------------------------------------------------------

PHASES = {"after-last-checkpoint": None, "evaluate": "evaluate",
          "summary-write": "replace:summary.json"}

CHILD = textwrap.dedent("""
    import json, pathlib, sys
    sys.path.insert(0, sys.argv[1])
    import test_reliability as t
    getattr(t, sys.argv[2])(pathlib.Path(sys.argv[3]), *json.loads(sys.argv[4]))
""")


def _child(fn: str, run: Path, *args) -> list[str]:
    """The command that runs ``fn(run, *args)`` of this module in a fresh interpreter."""
    return [PY, "-c", CHILD, str(Path(__file__).parent), fn, str(run), json.dumps(args)]


RGC_TEXT = b"It is a truth universally acknowledged, that a single man in want of a wife. " * 120


def _rgc_run(out: Path, executor: str, steps: int = 6):
    import torch

    from lmrepro.rgc import RGCConfig, train

    torch.set_num_threads(1)
    data = np.frombuffer(RGC_TEXT, dtype=np.uint8).copy()
    cfg = RGCConfig(**{**TINY_RGC, "steps": steps, "checkpoint_every": 3,
                       "timeout_s": 60.0})
    return train(cfg, executor, data[:6000], data[6000:], out, corpus="austen")


def _finite_json(path: Path) -> dict:
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path}: {c}"))


def _same_run(resumed: Path, reference: Path) -> dict:
    """The resumed run equals the uninterrupted one, has a valid finite summary and no step
    logged twice; returns the resumed summary."""
    a, b = _finite_json(resumed / "summary.json"), _finite_json(reference / "summary.json")
    read_summary(resumed)                                   # a valid RunSummary
    assert a["final_bpb"] == b["final_bpb"] and a["steps"] == b["steps"]
    assert a["tokens"] == b["tokens"] and a["train_time_s"] > 0
    assert a["tokens_per_s"] == pytest.approx(a["tokens"] / a["train_time_s"], rel=1e-6)
    assert _finite_json(resumed / "eval_losses.json") == _finite_json(reference /
                                                                      "eval_losses.json")

    def rows(path: Path) -> list[dict]:
        # wall-clock seconds (step_time_s, mask_wait_s, worker_wait_s, ...) differ
        return [{k: v for k, v in r.items() if not k.endswith("_s")}
                for r in read_jsonl(path / "metrics.jsonl")]

    assert rows(resumed) == rows(reference)                 # no duplicate, none missing
    return a


def _tagged(tag: str) -> list[int]:
    """Live processes whose environment carries ``LMREPRO_TEST_TAG=tag`` (a run's processes)."""
    import psutil
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("LMREPRO_TEST_TAG") == tag:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def _kill_at(cmd: list[str], run: Path, fault: str) -> None:
    """Run ``cmd`` until it SIGKILLs itself at ``fault``; check that none of its processes is
    left within 10 s (output to a file: a pipe would wait for orphans holding it)."""
    tag = f"{run}-{fault}-{os.getpid()}"
    log = run.parent / f"{run.name}.killed.log"
    with open(log, "w") as out:
        killed = subprocess.run(cmd, env=env(**{FAULT_ENV: fault, "LMREPRO_TEST_TAG": tag}),
                                stdout=out, stderr=subprocess.STDOUT, timeout=300)
    assert killed.returncode == -signal.SIGKILL, (fault, log.read_text()[-3000:])
    assert not (run / "summary.json").exists()
    assert gone_within(_tagged(tag), 10.0) < 10.0       # stage workers too: nothing writes on


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs, made once: ``references(kind)`` is the run directory."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            out = tmp_path_factory.mktemp("ref") / kind
            if kind == "baseline":
                _baseline_run(out, steps=6)
            else:
                _rgc_run(out, kind)
            made[kind] = out
        return made[kind]

    return get


@pytest.mark.parametrize("phase", list(PHASES))
def test_baseline_killed_at_the_end_resumes_to_the_same_complete_run(tmp_path, references,
                                                                      phase):
    run = tmp_path / "run"
    _kill_at(_child("_baseline_run", run, 6), run, PHASES[phase] or "checkpoint-published@6")
    _baseline_run(run, steps=6)                            # the resume
    summary = _same_run(run, references("baseline"))
    assert summary["resumed_from_step"] == 6             # nothing left to train
    # the peak memory is the training's (recorded in the checkpoint), not the resume's alone
    trained = load_checkpoint(run, latest_checkpoint(run)["identity"])["peak_memory"]
    assert trained["rss"] > 0 and summary["peak_rss_bytes"] >= trained["rss"]


@pytest.mark.parametrize("executor", ["sync", pytest.param("async", marks=pytest.mark.slow)])
@pytest.mark.parametrize("phase", list(PHASES))
def test_rgc_killed_at_the_end_resumes_to_the_same_complete_run(tmp_path, references, executor,
                                                                 phase):
    """The sync executor (whose loop the backprop executor shares) and the async one, whose
    stage workers must not outlive the killed run."""
    run = tmp_path / "run"
    _kill_at(_child("_rgc_run", run, executor), run, PHASES[phase] or "checkpoint-published@6")
    _rgc_run(run, executor)                                # the resume
    summary = _same_run(run, references(executor))
    assert summary["resumed_from_step"] == 6             # nothing left to train
    # the peak memory is the training's (recorded in the checkpoint), not the resume's alone
    trained = load_checkpoint(run, latest_checkpoint(run)["identity"])["peak_memory"]
    assert trained["rss"] > 0 and summary["peak_rss_bytes"] >= trained["rss"]


@pytest.fixture(scope="module")
def scape_case(tmp_path_factory):
    """A tiny corpus, the run's arguments and an uninterrupted reference run."""
    from _dist_helpers import write_tiny_corpus
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun
    from lmrepro.scape.train.launch import launch_train_scape

    root = tmp_path_factory.mktemp("scape")
    corpus = write_tiny_corpus(root / "corpus")
    cfg = ScapeConfig(steps=8, batch_size=2, lr=3e-3, warmup_steps=2, eval_batches=2,
                      eval_batch_size=4, checkpoint_every=4, timeout_s=30)
    args = (cfg, ScapeRun(name="s", optimizer="scape", sparsity=0.9),
            ModelConfig(n_layers=1, d_model=16, n_heads=2, context=16))
    ref = launch_train_scape(corpus, root / "ref", 2, *args, seed=1, timeout_s=200)
    return corpus, args, ref


@pytest.mark.slow
@pytest.mark.parametrize("phase", list(PHASES))
def test_scape_killed_at_the_end_resumes_to_the_same_complete_run(tmp_path, scape_case, phase):
    from lmrepro.scape.train.launch import launch_train_scape

    corpus, args, ref = scape_case
    tag = f"scape-{phase}-{os.getpid()}"
    # SCAPE's last checkpoint is its last periodic one (step 4 of 8): a resume retrains 4..7
    killed = launch_train_scape(corpus, tmp_path / "run", 2, *args, seed=1, timeout_s=200,
                                env={FAULT_ENV: PHASES[phase] or "checkpoint-published@4",
                                     "LMREPRO_TEST_TAG": tag}, check_exit=False)
    assert not (killed / "summary.json").exists()
    assert "SIGKILL" in (killed / "launch.log").read_text()
    assert gone_within(_tagged(tag), 10.0) < 10.0         # rank 1 and the agent ended too
    done = launch_train_scape(corpus, killed, 2, *args, seed=1, timeout_s=200)
    summary = _same_run(done, ref)
    assert summary["resumed_from_step"] == 4


# ------------------------------------------------------------------------------------------------
# strict parameter files
# ------------------------------------------------------------------------------------------------

def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def _variant(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    mutate(raw)
    return _write(tmp_path, yaml.safe_dump(raw, sort_keys=False))


LAX = [
    ("seeds: [yes]", lambda r: r.__setitem__("seeds", [True]),
     "seeds.0 = True: must be a valid integer"),
    ("tie_embeddings: 'off'", lambda r: r["model"].__setitem__("tie_embeddings", "off"),
     "model.tie_embeddings = 'off': must be a valid boolean"),
    ("n_layers: '7'", lambda r: r["model"].__setitem__("n_layers", "7"),
     "model.n_layers = '7': must be a valid integer"),
    ("train.steps: twenty under smoke",
     lambda r: (r.__setitem__("profile", "smoke"), r["train"].__setitem__("steps", "twenty")),
     "(profile 'default'): train.steps = 'twenty': must be a valid integer"),
    ("bad value in a profile not active",
     lambda r: r["profiles"]["paper"]["rgc"].__setitem__("lr", "fast"),
     "(profile 'paper'): rgc.lr = 'fast': must be a valid number"),
    ("horizon beyond the stages", lambda r: r["rgc"].__setitem__("horizon", 5),
     "rgc.horizon = 5: must be an integer in [1, n_stages = 4]"),
]


@pytest.mark.parametrize("mutate,expected", [c[1:] for c in LAX], ids=[c[0] for c in LAX])
def test_lax_parameters_are_refused(tmp_path, mutate, expected):
    with pytest.raises(ParameterError) as info:
        load_params(_variant(tmp_path, mutate))
    assert expected in str(info.value)


def test_a_duplicate_key_is_refused_with_file_line_and_column(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    nested = text.replace("  n_layers: 4\n", "  n_layers: 4\n  n_layers: 6\n", 1)
    lines = nested.splitlines()
    first = lines.index("  n_layers: 4") + 1
    with pytest.raises(ParameterError) as info:
        load_params(_write(tmp_path, nested))
    assert str(info.value) == (f"{tmp_path / 'params.yaml'}:{first + 1}:3: duplicate key "
                               f"'n_layers' (first given at line {first}); YAML would silently "
                               "keep only the last value: remove one")
    with pytest.raises(ParameterError, match=r"params.yaml:\d+:1: duplicate key 'seeds'"):
        load_params(_write(tmp_path, text + "seeds: [1]\n"))
    # a merge key is not a duplicate: an explicit key may override a merged one
    from lmrepro.paramfile import load_yaml
    assert load_yaml("b: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\n", "f") == \
        {"b": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}}


def test_a_yaml_syntax_error_is_one_line_naming_file_line_and_column(tmp_path):
    text = (ROOT / "params.yaml").read_text().replace("  d_model: 128\n", "  d_model 128\n", 1)
    path = _write(tmp_path, text)
    line = text.splitlines().index("  d_model 128") + 1
    proc = subprocess.run([PY, "-m", "lmrepro", "validate", "--params", str(path)],
                          capture_output=True, text=True, env=env())
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"lmrepro: error: {path}:{line + 1}:")
    assert "YAML syntax error" in proc.stderr


def test_the_loader_stays_safe():
    from lmrepro.paramfile import StrictLoader, load_yaml

    assert issubclass(StrictLoader, yaml.SafeLoader)
    with pytest.raises(ParameterError, match="could not determine a constructor"):
        load_yaml("a: !!python/object/apply:os.system ['true']\n", "evil.yaml")


# ------------------------------------------------------------------------------------------------
# the pipeline under real kills and a bad parameter (the scenario, end to end)
# ------------------------------------------------------------------------------------------------

def _dvc_repro(proj: Path, tag: str) -> subprocess.Popen:
    with open(proj / "repro.log", "a") as log:      # the child keeps its own copy of the fd
        return subprocess.Popen([str(BIN / "dvc"), "repro"], cwd=proj, stdout=log,
                                stderr=subprocess.STDOUT, env=env(LMREPRO_TEST_TAG=tag))


def _loss_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl", drop_partial_tail=True)
            if "loss" in r]


def _kill_when(proc: subprocess.Popen, ready, victim, tag: str, what: str) -> float:
    """SIGKILL ``victim()`` once ``ready()``; return the seconds until no process of the run
    (``tag``) is left."""
    try:
        wait_for(lambda: ready() or proc.poll() is not None, 900, what, poll=0.01)
        assert proc.poll() is None, f"dvc repro ended before {what}"
        os.kill(victim(), signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: not _tagged(tag), 30, f"every process of the run to end after {what}",
                 poll=0.1)
        return time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _snapshot(proj: Path) -> dict[str, bytes]:
    files = [p for d in ("results", "reports", "data/prepared") for p in (proj / d).rglob("*")
             if p.is_file()]
    return {str(p.relative_to(proj)): p.read_bytes() for p in files + [proj / "dvc.lock"]}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_pipeline_survives_sigkills_and_a_bad_parameter_keeps_every_product(tmp_path):
    """``kill -9`` of ``dvc repro`` during train_scape, then of the stage process during
    train_rgc: within seconds no process of the run is left (nothing keeps writing), no
    ``reports/tmp*`` is left, and the next ``dvc repro`` finishes with duplicate-free metrics
    equal to uninterrupted runs. Then a bad parameter fails at ``validate`` with one line and
    leaves every product byte for byte in place."""
    import psutil
    from test_pipeline import copy_project

    from lmrepro.data.stage import load_splits
    from lmrepro.rgc.executors.runner import train as train_rgc
    from lmrepro.scape.train.launch import launch_train_scape

    proj = copy_project(tmp_path / "proj")
    raw = yaml.safe_load((proj / "params.yaml").read_text())
    # long enough that a kill lands mid-run (checkpoints at 10 / 20)
    raw["profiles"]["smoke"]["scape"].update(steps=100, checkpoint_every=10)
    raw["profiles"]["smoke"]["rgc"].update(steps=120, checkpoint_every=20)
    raw["profiles"]["smoke"]["seeds"] = [0]         # one seed: the kills are the point here
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=proj, check=True, capture_output=True)
    params = load_params(proj / "params.yaml")
    scape_runs = proj / "results" / "scape" / "runs" / "shakespeare" / "seed0"
    rgc_runs = proj / "results" / "rgc" / "runs" / "shakespeare" / "seed0"

    # 1. SIGKILL of dvc repro while scape90 trains (after its checkpoint at step 10)
    tag = f"repro-a-{os.getpid()}"
    dvc = _dvc_repro(proj, tag)
    latest = scape_runs / "scape90" / "checkpoints" / "latest.json"
    left = _kill_when(dvc, lambda: latest.exists(), lambda: dvc.pid, tag, "scape90's checkpoint")
    assert left < 10.0
    assert not (scape_runs / "scape90" / "summary.json").exists(), "killed too late"
    assert not list((proj / "reports").glob("tmp*"))

    # 2. SIGKILL of the stage process (lmrepro notebook) while rgc-async trains
    tag = f"repro-b-{os.getpid()}"
    dvc = _dvc_repro(proj, tag)

    stage_pid: list[int] = []      # found before the moment to kill comes: no scan then

    def async_run_checkpointed() -> bool:
        if not stage_pid:
            for pid in _tagged(tag):
                with contextlib.suppress(psutil.Error):
                    cmdline = psutil.Process(pid).cmdline()
                    if "notebook" in cmdline and any("05_train_rgc" in a for a in cmdline):
                        stage_pid.append(pid)
                        break
        return bool(stage_pid) and async_latest.exists() and len(_loss_steps(
            rgc_runs / "rgc-async")) >= 25

    async_latest = rgc_runs / "rgc-async" / "checkpoints" / "latest.json"
    left = _kill_when(dvc, async_run_checkpointed, lambda: stage_pid[0], tag,
                      "rgc-async's checkpoint")
    assert left < 10.0
    assert not (rgc_runs / "rgc-async" / "summary.json").exists(), "killed too late"
    assert not list((proj / "reports").glob("tmp*"))

    # 3. the next dvc repro finishes; every run's metrics are complete and duplicate-free
    third = subprocess.run([str(BIN / "dvc"), "repro"], cwd=proj, capture_output=True,
                           text=True, env=env(), timeout=1200)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    for runs, steps in ((scape_runs, params.scape.steps), (rgc_runs, params.rgc.steps)):
        for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
            assert _loss_steps(run_dir) == list(range(steps)), run_dir.name
    # resumed from a checkpoint the killed attempt wrote (the last one before its processes ended)
    assert 10 <= read_summary(scape_runs / "scape90").resumed_from_step < params.scape.steps
    assert 20 <= read_summary(rgc_runs / "rgc-async").resumed_from_step < params.rgc.steps
    curve = (proj / "results" / "scape" / "loss_curve.csv").read_text().splitlines()
    assert len(curve) == 1 + len(params.scape.runs) * params.scape.steps
    assert not list(proj.glob("results/*/runs.stale-*")) and not list(proj.glob("reports/tmp*"))

    # ... and equal to uninterrupted runs of the same configuration
    run = next(r for r in params.scape.runs if r.run_name == "scape90")
    ref = launch_train_scape(proj / "data" / "prepared" / "shakespeare", tmp_path / "scape90",
                             params.scape.world_size, params.scape.settings, run,
                             params.scape.model or params.model, seed=0,
                             corpus="shakespeare", timeout_s=600)
    got, want = read_run(scape_runs / "scape90"), read_run(ref)
    assert got["eval_losses"] == want["eval_losses"]
    assert [r["loss"] for r in got["metrics"] if "loss" in r] == \
        [r["loss"] for r in want["metrics"] if "loss" in r]
    metrics = json.loads((proj / "results" / "scape" / "metrics.json").read_text())
    assert metrics["shakespeare/seed0/scape90"]["bytes_per_step"] == \
        want["summary"]["bytes_per_step"]["total"]
    train_data, val_data = load_splits(proj / "data" / "prepared", "shakespeare")
    straight = train_rgc(params.rgc.config, "async", np.asarray(train_data),
                         np.asarray(val_data), tmp_path / "rgc-async", "shakespeare",
                         "rgc-async", seed=0)
    assert read_run(rgc_runs / "rgc-async")["eval_losses"] == straight.eval_losses

    # 4. a bad parameter: validate fails with one line; every product stays, byte for byte
    before = _snapshot(proj)
    raw["profiles"]["smoke"]["train"]["steps"] = "twenty"
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    bad = subprocess.run([str(BIN / "dvc"), "repro"], cwd=proj, capture_output=True, text=True,
                         env=env(), timeout=600)
    assert bad.returncode != 0
    output = bad.stdout + bad.stderr
    errors = [line for line in output.splitlines() if line.startswith("lmrepro: error:")]
    assert errors == ["lmrepro: error: params.yaml (profile 'smoke'): train.steps = 'twenty': "
                      "must be a valid integer"], output[-3000:]
    assert "Traceback" not in output and "Running stage 'validate'" in output
    assert "Running stage 'train_baseline'" not in output
    assert _snapshot(proj) == before


# ------------------------------------------------------------------------------------------------
# the notebook runner: one-line errors, nothing left behind when killed
# ------------------------------------------------------------------------------------------------

def _notebook(path: Path, source: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell('params_file = "params.yaml"\nprofile = None',
                                          metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)
    return path


#: a line of the runner's own log (lmrepro's logging format): its progress and papermill's
_RUNNER_LOG = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ INFO (lmrepro\.[\w.]+|papermill): ")


def _foreign_lines(stderr: str) -> list[str]:
    """Lines of a notebook run's stderr that are neither our one-line error nor the runner's
    log: a kernel's warnings, tracebacks of its shutdown, asyncio's complaints."""
    return [line for line in stderr.splitlines()
            if not line.startswith("lmrepro: error:") and not _RUNNER_LOG.match(line)]


@pytest.mark.slow
def test_a_notebook_failing_on_our_own_error_is_one_line(tmp_path):
    nb = _notebook(tmp_path / "nb.ipynb", "from lmrepro.runlock import RunDirectoryBusy\n"
                   "raise RunDirectoryBusy('results/x/runs', 'PID 123 (lmrepro notebook)')")
    proc = subprocess.run([PY, "-m", "lmrepro", "notebook", str(nb), "--reports",
                           str(tmp_path / "reports")], cwd=ROOT, capture_output=True, text=True,
                          env=env(), timeout=300)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("lmrepro:")]
    assert errors == [f"lmrepro: error: {nb} failed: RunDirectoryBusy: run directory = "
                      "'results/x/runs': is being written by PID 123 (lmrepro notebook); one "
                      "writer per run directory: wait for that run to end (or stop it), then "
                      "run again"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert _foreign_lines(proc.stderr) == [], proc.stderr[-3000:]
    # a bad parameter file given to a notebook (as every stage notebook reads it)
    bad = _variant(tmp_path, lambda r: r["model"].__setitem__("n_layers", "7"))
    nb = _notebook(tmp_path / "params.ipynb", "from lmrepro.pipeline.session import start\n"
                   "from lmrepro.wings import WINGS\n"
                   "start(params_file, profile, wings=WINGS)")
    proc = subprocess.run([PY, "-m", "lmrepro", "notebook", str(nb), "--params", str(bad),
                           "--reports", str(tmp_path / "reports")], cwd=ROOT,
                          capture_output=True, text=True, env=env(), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("lmrepro:")]
    assert errors == [f"lmrepro: error: {nb} failed: ConfigError: {bad} (profile 'default'): "
                      "model.n_layers = '7': must be a valid integer"], proc.stderr[-3000:]
    assert not (tmp_path / "reports" / "params.html").exists()


@pytest.mark.slow
def test_the_kernel_is_ended_without_an_interrupt(tmp_path):
    """``lmrepro notebook`` ends its kernel with a shutdown request only: jupyter_client's
    SIGINT first would land in whatever handler the kernel is still finishing (on a loaded
    machine, the reply to papermill's last request) and escape it with a traceback. Here the
    kernel is made slow at that point, between a reply and restoring its SIGINT handler, for
    every request after the failing cell; that handler must never see a KeyboardInterrupt."""
    marks = tmp_path / "handler.log"
    nb = _notebook(tmp_path / "slow.ipynb", textwrap.dedent(f"""\
        import time
        from ipykernel.kernelapp import IPKernelApp
        from lmrepro.runlock import RunDirectoryBusy

        kernel = IPKernelApp.instance().kernel
        restore_sigint = kernel.post_handler_hook

        def slow_post_handler_hook():
            with open({str(marks)!r}, "a") as log:
                log.write("handler end\\n")
                try:
                    time.sleep(2.0)
                except KeyboardInterrupt:
                    log.write("interrupted\\n")
                    raise
            restore_sigint()

        kernel.post_handler_hook = slow_post_handler_hook
        raise RunDirectoryBusy('results/x/runs', 'PID 123 (lmrepro notebook)')
        """))
    proc = subprocess.run([PY, "-m", "lmrepro", "notebook", str(nb), "--reports",
                           str(tmp_path / "reports")], cwd=ROOT, capture_output=True, text=True,
                          env=env(), timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    # the failing cell's request and papermill's closing kernel_info request
    assert marks.read_text().splitlines() == ["handler end", "handler end"]
    assert _foreign_lines(proc.stderr) == [], proc.stderr[-3000:]


@pytest.mark.slow
def test_a_killed_notebook_run_leaves_no_process_and_no_temporary_directory(tmp_path):
    """SIGKILL of ``lmrepro notebook`` (the stage process): its kernel ends within seconds, no
    ``reports/tmp*`` exists, and its scratch directory is removed by the next run."""
    import psutil

    reports, scratch = tmp_path / "reports", tmp_path / "scratch"
    scratch.mkdir()
    nb = _notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(300)")
    tag = f"nb-{os.getpid()}"
    proc = subprocess.Popen([PY, "-m", "lmrepro", "notebook", str(nb), "--reports", str(reports)],
                            cwd=ROOT, env=env(LMREPRO_TEST_TAG=tag, TMPDIR=str(scratch)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def kernel_started() -> bool:
        assert proc.poll() is None, "lmrepro notebook ended"
        with contextlib.suppress(psutil.Error):
            return any("ipykernel" in " ".join(psutil.Process(p).cmdline())
                       for p in children_of(proc.pid))
        return False

    wait_for(kernel_started, 60, "the kernel", poll=0.1)
    time.sleep(2.0)                                        # the cell is running
    left = list(scratch.glob("lmrepro-notebook-*"))
    assert len(left) == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not _tagged(tag), 10, "the kernel to end")
    assert not list(reports.glob("tmp*")) and not (reports / "slow.html").exists()
    assert left[0].exists()                                # SIGKILL: nothing could clean up
    quick = _notebook(tmp_path / "quick.ipynb", "x = 1")
    done = subprocess.run([PY, "-m", "lmrepro", "notebook", str(quick), "--reports",
                           str(reports)], cwd=ROOT, env=env(TMPDIR=str(scratch)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(scratch.glob("lmrepro-notebook-*"))   # the dead run's one removed too
    assert sorted(p.name for p in reports.iterdir()) == ["quick.html", "quick.ipynb"]
