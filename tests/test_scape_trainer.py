"""The torchrun trainer: results layout, kill -9 + resume bit-identity, bounded failure when a
peer dies or stalls, and bad input. Everything on gloo, 127.0.0.1, tiny models."""

from __future__ import annotations

import os
import time

import pytest
import torch

from _dist_helpers import run_workers, write_tiny_corpus
from lmrepro.errors import ParameterError
from lmrepro.io import read_json, torch_load
from lmrepro.results import read_run

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "context": 32}
COMMON = dict(steps=12, batch_size=4, lr=3e-3, warmup_steps=3, eval_batches=2, eval_batch_size=4,
              timeout_s=20)
SEED = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _run(corpus, out, optimizer, sparsity=0.0, **kw):
    """``(settings, run, model, target)`` of one run, for :func:`lmrepro.scape.trainer.train`."""
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun
    from lmrepro.scape.trainer import RunTarget

    return (ScapeConfig(**{**COMMON, **kw}), ScapeRun(optimizer=optimizer, sparsity=sparsity),
            ModelConfig(**TINY), RunTarget(corpus_dir=str(corpus), out=str(out), seed=SEED))


@pytest.mark.parametrize("optimizer,sparsity", [("adamw", 0.0), ("adams", 0.0),
                                                 ("topk", 0.99), ("scape", 0.9)])
def test_single_process_run_layout(corpus, tmp_path, monkeypatch, optimizer, sparsity):
    """World of one without torchrun (local collectives); results in the lmrepro.results layout."""
    from lmrepro.scape.trainer import train

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    out = train(*_run(corpus, tmp_path / "run", optimizer, sparsity, steps=6))
    run = read_run(out)
    s = run["summary"]
    for key in ("name", "method", "corpus", "steps", "tokens", "final_bpb", "tokens_per_s",
                "mean_step_time_s", "peak_rss_bytes", "seed", "processes", "sparsity",
                "bytes_per_step"):
        assert key in s, key
    assert s["method"] == optimizer and s["processes"] == 1 and s["steps"] == 6
    assert s["tokens"] == 6 * 4 * 32
    assert len(run["eval_losses"]) == 2 and 0 < s["final_bpb"] < 9
    steps = [r for r in run["metrics"] if "loss" in r]
    assert [r["step"] for r in steps] == list(range(6))
    assert set(s["bytes_per_step"]) == {"grad_values", "param_values", "mask", "total"}
    if optimizer in ("adamw", "adams"):
        n = sum(p.numel() for p in torch_load(out / "model_final.pt")["model"].values())
        assert steps[-1]["bytes_grad_values"] == 4 * n and steps[-1]["bytes_mask"] == 0
    # a finished run is skipped, not retrained
    mtime = (out / "summary.json").stat().st_mtime_ns
    train(*_run(corpus, tmp_path / "run", optimizer, sparsity, steps=6))
    assert (out / "summary.json").stat().st_mtime_ns == mtime


def test_bad_input(corpus, tmp_path):
    from lmrepro.scape.trainer import train

    with pytest.raises(ParameterError, match="sparsity.*dense"):
        train(*_run(corpus, tmp_path / "a", "adamw", 0.9))
    with pytest.raises(ParameterError, match=r"sparsity = 1.0.*less than 1"):
        train(*_run(corpus, tmp_path / "b", "scape", 1.0))
    with pytest.raises(ParameterError, match="corpus_dir"):
        train(*_run(tmp_path / "nothing", tmp_path / "c", "scape", 0.9))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_kill_worker_then_resume_is_bit_identical(corpus, tmp_path):
    """kill -9 of rank 1 mid-run (after a checkpoint), torchrun tears the job down; relaunching
    resumes from the checkpoint and ends with exactly the uninterrupted run's parameters,
    per-step losses and eval losses."""
    from lmrepro.scape.launch import launch_train_scape

    cfg, run, model, _ = _run(corpus, tmp_path, "scape", 0.9, checkpoint_every=4)
    args = (cfg, run, model)
    ref = launch_train_scape(corpus, tmp_path / "ref", 2, *args, seed=SEED, timeout_s=100)

    t0 = time.monotonic()
    killed = launch_train_scape(corpus, tmp_path / "killed", 2, *args, seed=SEED, timeout_s=100,
                                env={"LMREPRO_FAULT_KILL_AT": "7:1"}, check_exit=False)
    assert time.monotonic() - t0 < 60
    assert not (killed / "summary.json").exists()
    assert read_json(killed / "checkpoints" / "latest.json")["step"] == 4
    log = (killed / "launch.log").read_text()
    assert "rank      : 1" in log and "SIGKILL" in log
    done = launch_train_scape(corpus, killed, 2, *args, seed=SEED, timeout_s=100)
    assert "resuming" in (done / "launch.log").read_text()

    a, b = read_run(ref), read_run(done)
    keys = ("step", "loss", "lr", "bytes_grad_values", "bytes_param_values", "bytes_mask")
    rows_a = [{k: r[k] for k in keys} for r in a["metrics"] if "loss" in r]
    rows_b = [{k: r[k] for k in keys} for r in b["metrics"] if "loss" in r]
    assert len(rows_a) == 12 and rows_a == rows_b
    assert a["eval_losses"] == b["eval_losses"]
    assert a["summary"]["final_bpb"] == b["summary"]["final_bpb"]
    ma = torch_load(ref / "model_final.pt")["model"]
    mb = torch_load(done / "model_final.pt")["model"]
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    # SCAPE at 90 % really sent less than dense after the warm-start step
    assert rows_a[-1]["bytes_grad_values"] < rows_a[0]["bytes_grad_values"] / 5


def _stall_or_die(rank: int, world: int, mode: str, release) -> dict:
    from lmrepro.distributed import DistributedFailure, collective_guard, init_from_env

    ctx = init_from_env(timeout_s=6)
    if rank == 1:
        if mode == "die":
            os._exit(0)
        release.wait(30)          # stall: alive but never joins the collective
        return {}
    t0 = time.monotonic()
    try:
        with collective_guard(ctx, "test all-reduce"):
            torch.distributed.all_reduce(torch.ones(4))
    except DistributedFailure as err:
        release.set()
        return {"elapsed": time.monotonic() - t0, "message": str(err)}
    release.set()
    return {"elapsed": time.monotonic() - t0, "message": "no error"}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["stall", "die"])
def test_peer_failure_is_bounded_and_names_rank(mode):
    import multiprocessing as mp

    release = mp.get_context("spawn").Event()
    res = run_workers(_stall_or_die, 2, mode, release, init_pg=False, timeout=60,
                      expect=[0] if mode == "die" else [0, 1])
    assert "rank 0 of 2" in res[0]["message"] and "timeout 6 s" in res[0]["message"]
    assert res[0]["elapsed"] < 20


def test_cli_flags_and_launch_helpers(tmp_path, monkeypatch):
    import argparse

    from lmrepro.model import ModelConfig
    from lmrepro.scape import cli, launch
    from lmrepro.scape.config import ScapeConfig, ScapeRun, ScapeSuite

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    cfg, run, model, _ = _run("c", "o", "topk", 0.99, batch_size=4, eps=1e-7)
    argv = cli.worker_argv(cfg, run, model, "c", "o", seed=7)
    args = parser.parse_args(["train-scape", *argv, "--no-resume"])
    # the flags are generated from the configuration classes: a lossless round trip
    from lmrepro.config import from_arguments
    assert from_arguments(ScapeConfig, args) == cfg
    assert from_arguments(ScapeRun, args, exclude=("lr",)) == run
    assert from_arguments(ModelConfig, args, prefix="model_") == model
    assert args.seed == 7 and args.resume is False and args.corpus_dir == "c"
    # one default for a setting, whichever way it is given: an unset sparsity is 0 for the
    # pipeline's section and for the command line alike
    bare = parser.parse_args(["train-scape", "--corpus-dir", "c", "--out", "o", "--optimizer",
                              "topk", "--steps", "3", "--batch-size", "2", "--lr", "0.01",
                              "--warmup-steps", "0"])
    assert from_arguments(ScapeRun, bare).sparsity == ScapeRun(optimizer="topk").sparsity == 0.0
    with pytest.raises(ParameterError, match=r"sparsity = 1.5"):
        from_arguments(ScapeRun, parser.parse_args(["train-scape", "--corpus-dir", "c", "--out",
                                                    "o", "--optimizer", "topk", "--sparsity",
                                                    "1.5"]))
    cmd = launch.torchrun_command(2, ["--x"], nnodes=2, node_rank=1, rdzv_endpoint="h:29500")
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "h:29500" and "--standalone" not in cmd
    assert "train-scape" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"

    suite = ScapeSuite(world_size=3, steps=5, batch_size=2, lr=0.01, warmup_steps=0, corpus="x",
                       runs=[ScapeRun(name="a", optimizer="adamw"),
                             ScapeRun(name="b", optimizer="adams")])
    assert suite.settings.steps == 5 and "runs" not in suite.settings.to_dict()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text("{}")
    launched = []
    monkeypatch.setattr(launch, "launch_train_scape",
                        lambda corpus_dir, out, w, cfg, run, model, **kw: launched.append(
                            (out.name, cfg, kw)))
    dirs = launch.run_scape_suite("corpus", tmp_path, suite.settings, suite.runs, model,
                                  suite.world_size, seed=7)
    assert [d.name for d in dirs] == ["a", "b"]
    assert [name for name, _, _ in launched] == ["b"] and launched[0][1].steps == 5
    assert launched[0][2]["seed"] == 7
    with pytest.raises(ParameterError, match="unique"):
        ScapeSuite(steps=5, batch_size=2, lr=0.01, warmup_steps=0, corpus="x",
                   runs=[ScapeRun(name="a", optimizer="adamw"),
                         ScapeRun(name="a", optimizer="adams")])
