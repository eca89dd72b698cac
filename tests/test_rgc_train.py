"""Sync RGC and global-backprop executors: outputs, determinism, resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lmrepro.errors import ParameterError
from lmrepro.lifetime import FAULT_ENV
from lmrepro.results import read_run
from lmrepro.rgc import RGCConfig, train
from lmrepro.rgc.stage import run_executors

from _runs import latest_checkpoint

torch.set_num_threads(1)

TEXT = (b"It is a truth universally acknowledged, that a single man in possession of a good "
        b"fortune, must be in want of a wife. ") * 60
DATA = np.frombuffer(TEXT, dtype=np.uint8).copy()
TRAIN, VAL = DATA[:5000], DATA[5000:]


def cfg(**kw) -> RGCConfig:
    base = dict(model=dict(n_layers=4, d_model=16, n_heads=2, context=16), n_stages=2, horizon=1,
                steps=6,
                batch_size=4, micro_batches=2, warmup_steps=2, lr=3e-3, eval_batch_size=4,
                eval_batches=3, checkpoint_every=2, threads=(1, 1),
                backprop_threads=1)
    base.update(kw)
    return RGCConfig(**base)


@pytest.mark.parametrize("executor", ["sync", "backprop"])
def test_run_writes_results_layout_and_learns(executor: str, tmp_path: Path) -> None:
    c = cfg(steps=12, checkpoint_every=5, eval_every=6)
    r = train(c, executor, TRAIN, VAL, tmp_path / "run", corpus="austen")
    run = read_run(tmp_path / "run")
    s = run["summary"]
    for key in ("name", "method", "corpus", "steps", "tokens", "final_bpb", "tokens_per_s",
                "mean_step_time_s", "peak_rss_bytes", "seed", "threads"):
        assert key in s, key
    assert s["details"]["executor"] == executor                     # RGCDetails, BackpropDetails
    assert s["method"] == ("backprop" if executor == "backprop" else "rgc")
    assert s["corpus"] == "austen" and s["steps"] == 12 and s["tokens"] == 12 * 4 * 16
    assert s["final_bpb"] == pytest.approx(r.final_bpb)
    assert r.final_bpb == pytest.approx(np.mean(r.eval_losses) / np.log(2))
    assert run["eval_losses"] == r.eval_losses and len(r.eval_losses) == 3
    assert r.tokens_per_s > 0 and r.peak_rss_bytes > 50 * 2**20
    # the exact peaks: the sum of the processes' high-water marks bounds any sampled RSS sum
    exact = s["details"]["memory_exact"]
    assert exact["hwm_processes"] >= 1
    assert exact["hwm_sum_bytes"] >= exact["sampled_peak"]["rss"] > 50 * 2**20
    steps = [m["step"] for m in run["metrics"] if "loss" in m]
    assert steps == list(range(12))
    assert any("eval_bpb" in m for m in run["metrics"])
    losses = [m["loss"] for m in run["metrics"] if "loss" in m]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])  # it learns the repeated sentence
    assert latest_checkpoint(tmp_path / "run")["step"] == 12


def test_same_seed_same_metrics_and_different_seed_differs() -> None:
    a = train(cfg(), "sync", TRAIN, VAL)
    b = train(cfg(), "sync", TRAIN, VAL)
    c = train(cfg(), "sync", TRAIN, VAL, seed=1)
    strip = lambda ms: [{k: v for k, v in m.items() if k != "step_time_s"} for m in ms]  # noqa
    assert strip(a.metrics) == strip(b.metrics) and a.eval_losses == b.eval_losses
    assert a.eval_losses != c.eval_losses
    p = train(cfg(), "backprop", TRAIN, VAL)
    q = train(cfg(), "backprop", TRAIN, VAL)
    assert strip(p.metrics) == strip(q.metrics) and p.eval_losses == q.eval_losses
    # RGC and backprop share the data and init: identical first-step last-stage loss
    assert a.metrics[0]["loss"] == p.metrics[0]["loss"]
    assert a.eval_losses != p.eval_losses


@pytest.mark.parametrize("executor", ["sync", "backprop"])
def test_resume_is_bit_identical(executor: str, tmp_path: Path) -> None:
    c = cfg(steps=7, checkpoint_every=2, horizon=2 if executor == "sync" else 1)
    straight = train(c, executor, TRAIN, VAL, tmp_path / "a")
    part = train(c, executor, TRAIN, VAL, tmp_path / "b", stop_after=5)  # "killed" after 5
    assert part.summary == {} and not (tmp_path / "b" / "summary.json").exists()
    assert latest_checkpoint(tmp_path / "b")["step"] == 4
    resumed = train(c, executor, TRAIN, VAL, tmp_path / "b")
    assert resumed.summary["resumed_from_step"] == 4
    for n, v in straight.final_state.items():
        assert torch.equal(v, resumed.final_state[n]), n
    assert straight.eval_losses == resumed.eval_losses
    metrics = read_run(tmp_path / "b")["metrics"]
    assert [m["step"] for m in metrics] == list(range(7))  # step 4 not logged twice


def test_resume_refuses_a_different_config(tmp_path: Path) -> None:
    train(cfg(), "sync", TRAIN, VAL, tmp_path / "r", stop_after=2)
    with pytest.raises(ParameterError, match="different run"):
        train(cfg(lr=1e-2), "sync", TRAIN, VAL, tmp_path / "r")


KILL_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, torch
    torch.set_num_threads(1)
    from lmrepro.rgc import RGCConfig, train
    import json
    cfg = RGCConfig(**json.loads(sys.argv[2]))
    data = np.fromfile(sys.argv[3], dtype=np.uint8)
    train(cfg, "sync", data[:5000], data[5000:], sys.argv[1])
""")


def test_real_kill_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    c = cfg(steps=40, checkpoint_every=1)
    kw = json.dumps({**c.to_dict(), "threads": [1, 1]})
    DATA.tofile(tmp_path / "data.bin")
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "k"), kw,
                             str(tmp_path / "data.bin")])
    run_dir = tmp_path / "k"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        latest = latest_checkpoint(run_dir)
        if latest is not None and latest["step"] >= 3 or proc.poll() is not None:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = latest_checkpoint(run_dir)["step"]
    assert 3 <= killed_at < 40
    resumed = train(c, "sync", TRAIN, VAL, tmp_path / "k")
    straight = train(c, "sync", TRAIN, VAL)
    assert resumed.summary["resumed_from_step"] >= 3
    for n, v in straight.final_state.items():
        assert torch.equal(v, resumed.final_state[n]), n


def test_run_suite_skips_finished_runs(tmp_path: Path) -> None:
    c = cfg(steps=3)
    out = run_executors(TRAIN, VAL, "austen", tmp_path, c, executors=("sync", "backprop"))
    assert set(out) == {"sync", "backprop"}
    assert out["sync"]["name"] == "rgc-sync" and out["backprop"]["name"] == "backprop"
    mtime = (tmp_path / "rgc-sync" / "summary.json").stat().st_mtime_ns
    again = run_executors(TRAIN, VAL, "austen", tmp_path, c, executors=("sync",))
    assert (tmp_path / "rgc-sync" / "summary.json").stat().st_mtime_ns == mtime
    assert again["sync"] == out["sync"]


def test_bad_inputs_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParameterError, match="executor"):
        train(cfg(), "pipeline", TRAIN, VAL)
    with pytest.raises(ParameterError, match="train_data"):
        train(cfg(), "sync", TRAIN.astype(np.int64), VAL)
    # a horizon outside [1, K] (K = 2 here) is refused before anything runs
    with pytest.raises(ParameterError, match=r"rgc.horizon = 3: must be an integer in \[1, "):
        train(cfg(horizon=3), "async", TRAIN, VAL)
    # a test's fault point that cannot fire is refused too
    monkeypatch.setenv(FAULT_ENV, "rgc-stage0-backward@1=raise")  # H = 1: no backward
    with pytest.raises(ParameterError, match="fault"):
        train(cfg(), "async", TRAIN, VAL)
    monkeypatch.setenv(FAULT_ENV, "rgc-stage2@1=raise")  # no stage 2
    with pytest.raises(ParameterError, match="fault"):
        train(cfg(), "async", TRAIN, VAL)
    monkeypatch.setenv(FAULT_ENV, "rgc-stage0@1=raise")  # the sync executor has none
    with pytest.raises(ParameterError, match="fault"):
        train(cfg(), "sync", TRAIN, VAL)


def test_cli_train_rgc(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from lmrepro.rgc.cli import main

    TRAIN.tofile(tmp_path / "train.bin")
    VAL.tofile(tmp_path / "val.bin")
    args = ["train-rgc", "--executor", "backprop", "--out", str(tmp_path / "run"),
            "--train-file", str(tmp_path / "train.bin"), "--val-file", str(tmp_path / "val.bin"),
            "--config-json", json.dumps({**cfg(steps=2).to_dict()}), "--seed", "3"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "backprop" and summary["seed"] == 3 and summary["steps"] == 2
    assert read_run(tmp_path / "run")["summary"]["final_bpb"] == summary["final_bpb"]
    # a bad flag value names the flag the user typed (not the parameter file's key path)
    with pytest.raises(ParameterError, match=r"--horizon = 9: must be an integer in \[1, "):
        main(args[:-2] + ["--horizon", "9"])
