import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from lmrepro.baseline.config import BaselineConfig
from lmrepro.baseline.trainer import train_single
from lmrepro.errors import ParameterError
from lmrepro.evaluation import cosine_lr
from lmrepro.io import read_jsonl
from lmrepro.model import ModelConfig

from _runs import latest_checkpoint, load_checkpoint

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=2, context=32)
SEED = 3


def settings(**kw) -> BaselineConfig:
    base = dict(steps=40, batch_size=8, lr=3e-3, warmup_steps=4, eval_every=20, eval_batches=4,
                eval_batch_size=8, checkpoint_every=10, log_every=1, threads=1)
    base.update(kw)
    return BaselineConfig(**base)


def final_state(run_dir):
    """The model state of a run's last checkpoint."""
    latest = latest_checkpoint(run_dir)
    return load_checkpoint(run_dir, latest["identity"])


def test_cosine_schedule_shape():
    lrs = [cosine_lr(s, 100, 10, 1.0, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_loss_falls_and_run_directory_is_complete(tmp_path, text_bytes):
    train, val = text_bytes[:70000], text_bytes[70000:]
    summary = train_single(CFG, settings(steps=60), train, val, tmp_path, seed=SEED,
                           corpus="toy", progress=False)
    losses = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    ev = json.loads((tmp_path / "eval_losses.json").read_text())
    assert len(ev["losses"]) == 4 and summary["final_bpb"] < 8.0
    assert summary["final_bpb"] == pytest.approx(np.mean(ev["losses"]) / np.log(2))
    assert summary["tokens"] == 60 * 8 * 32 and summary["tokens_per_s"] > 0


KILL_AT_CHECKPOINT = textwrap.dedent("""
    import os, signal, sys, json, numpy as np, torch
    torch.set_num_threads(1)
    from lmrepro.model import ModelConfig
    from lmrepro.checkpoints import Checkpoints
    from lmrepro.baseline import trainer as T
    from lmrepro.baseline.config import BaselineConfig
    real = Checkpoints.publish
    def save_then_die(out_dir, step, *a, **k):
        real(out_dir, step, *a, **k)
        if step == int(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)  # a kill -9 right after a checkpoint
    Checkpoints.publish = save_then_die
    cfg, settings, data_path, out, seed = json.loads(sys.argv[2])
    data = np.load(data_path)
    T.train_single(ModelConfig(**cfg), BaselineConfig(**settings), data[:70000], data[70000:],
                   out, seed=seed, progress=False)
""")


@pytest.mark.parametrize("kill_at", [10, 30])
def test_resume_after_kill_is_bit_identical(tmp_path, text_bytes, kill_at):
    train, val = text_bytes[:70000], text_bytes[70000:]
    full = settings()
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_single(CFG, full, train, val, straight, seed=SEED, progress=False)

    np.save(tmp_path / "d.npy", text_bytes)
    args = json.dumps([CFG.to_dict(), full.to_dict(), str(tmp_path / "d.npy"), str(resumed),
                       SEED])
    proc = subprocess.run([sys.executable, "-c", KILL_AT_CHECKPOINT, str(kill_at), args],
                          capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert latest_checkpoint(resumed)["step"] == kill_at
    assert not (resumed / "summary.json").exists()
    train_single(CFG, full, train, val, resumed, seed=SEED, progress=False)

    a, b = final_state(straight), final_state(resumed)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "step_time_s"} for r in rows]

    assert strip(read_jsonl(straight / "metrics.jsonl")) == \
        strip(read_jsonl(resumed / "metrics.jsonl"))
    assert (straight / "eval_losses.json").read_text() == (resumed / "eval_losses.json").read_text()


def test_checkpoint_of_other_config_is_not_resumed(tmp_path, text_bytes):
    # one checkpoint rule for every trainer (lmrepro.results): another configuration's
    # checkpoint is never resumed, and never overwritten: the run stops naming the directory
    train, val = text_bytes[:70000], text_bytes[70000:]
    first = tmp_path / "first"
    train_single(CFG, settings(steps=10), train, val, first, seed=SEED, progress=False)
    with pytest.raises(ParameterError, match="different run"):
        train_single(CFG, settings(steps=12, lr=1e-3), train, val, first, seed=SEED,
                     progress=False)
    assert latest_checkpoint(first)["step"] == 10
    other = train_single(CFG, settings(steps=12, lr=1e-3), train, val, tmp_path / "other",
                         seed=SEED, progress=False)
    rows = [r for r in read_jsonl(tmp_path / "other" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(12)) and other["steps"] == 12


@pytest.mark.parametrize("kw,name", [(dict(steps=-3), "train.steps"), (dict(lr=0.0), "train.lr"),
                                     (dict(batch_size=0), "train.batch_size")])
def test_bad_settings(kw, name):
    with pytest.raises(ParameterError, match=name):
        settings(**kw)


def test_context_longer_than_data(tmp_path):
    data = np.zeros(20, dtype=np.uint8)
    with pytest.raises(ParameterError, match="model.context"):
        train_single(CFG, settings(), data, data, tmp_path, seed=SEED, progress=False)
