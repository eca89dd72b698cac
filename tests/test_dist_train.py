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
COMMON = dict(steps=12, batch_size=4, lr=3e-3, warmup=3, seed=3, model=TINY, eval_batches=2,
              eval_batch_size=4, timeout_s=20)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _cfg(corpus, out, **kw):
    from lmrepro.dist.train_scape import ScapeTrainConfig

    return ScapeTrainConfig(corpus_dir=str(corpus), out=str(out), **{**COMMON, **kw})


@pytest.mark.parametrize("optimizer,sparsity", [("adamw", 0.0), ("adams", 0.0),
                                                 ("topk", 0.99), ("scape", 0.9)])
def test_single_process_run_layout(corpus, tmp_path, monkeypatch, optimizer, sparsity):
    """World of one without torchrun (local collectives); results in the lmrepro.results layout."""
    from lmrepro.dist.train_scape import train

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    out = train(_cfg(corpus, tmp_path / "run", optimizer=optimizer, sparsity=sparsity, steps=6))
    run = read_run(out)
    s = run["summary"]
    for key in ("name", "method", "corpus", "steps", "tokens", "final_bpb", "tokens_per_s",
                "mean_step_time_s", "peak_rss_bytes", "seed", "world_size", "sparsity",
                "bytes_per_step"):
        assert key in s, key
    assert s["method"] == optimizer and s["world_size"] == 1 and s["steps"] == 6
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
    train(_cfg(corpus, tmp_path / "run", optimizer=optimizer, sparsity=sparsity, steps=6))
    assert (out / "summary.json").stat().st_mtime_ns == mtime


def test_bad_input(corpus, tmp_path):
    from lmrepro.dist.train_scape import train

    with pytest.raises(ParameterError, match="sparsity.*dense"):
        train(_cfg(corpus, tmp_path / "a", optimizer="adamw", sparsity=0.9))
    with pytest.raises(ParameterError, match=r"sparsity.*\[0, 1\)"):
        train(_cfg(corpus, tmp_path / "b", optimizer="scape", sparsity=1.0))
    with pytest.raises(ParameterError, match="corpus_dir"):
        train(_cfg(tmp_path / "nothing", tmp_path / "c", optimizer="scape", sparsity=0.9))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_kill_worker_then_resume_is_bit_identical(corpus, tmp_path):
    """kill -9 of rank 1 mid-run (after a checkpoint), torchrun tears the job down; relaunching
    resumes from the checkpoint and ends with exactly the uninterrupted run's parameters,
    per-step losses and eval losses."""
    from lmrepro.dist.launch import launch_train_scape

    args = dict(COMMON, optimizer="scape", sparsity=0.9, checkpoint_every=4)
    ref = launch_train_scape(corpus, tmp_path / "ref", 2, args, timeout_s=100)

    t0 = time.monotonic()
    killed = launch_train_scape(corpus, tmp_path / "killed", 2, args, timeout_s=100,
                                env={"LMREPRO_FAULT_KILL_AT": "7:1"}, check_exit=False)
    assert time.monotonic() - t0 < 60
    assert not (killed / "summary.json").exists()
    assert read_json(killed / "checkpoints" / "latest.json")["step"] == 4
    log = (killed / "launch.log").read_text()
    assert "rank      : 1" in log and "SIGKILL" in log
    done = launch_train_scape(corpus, killed, 2, args, timeout_s=100)
    assert "resuming" in (done / "launch.log").read_text()

    a, b = read_run(ref), read_run(done)
    keys = ("step", "loss", "lr", "bytes_grad_values", "bytes_param_values", "bytes_mask")
    rows_a = [{k: r[k] for k in keys} for r in a["metrics"] if "loss" in r]
    rows_b = [{k: r[k] for k in keys} for r in b["metrics"] if "loss" in r]
    assert len(rows_a) == 12 and rows_a == rows_b
    assert a["eval_losses"] == b["eval_losses"]
    assert a["summary"]["final_bpb"] == b["summary"]["final_bpb"]
    ma, mb = torch_load(ref / "model_final.pt")["model"], torch_load(done / "model_final.pt")["model"]
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    # SCAPE at 90 % really sent less than dense after the warm-start step
    assert rows_a[-1]["bytes_grad_values"] < rows_a[0]["bytes_grad_values"] / 5


def _stall_or_die(rank: int, world: int, mode: str, release) -> dict:
    from lmrepro.dist.runtime import DistributedFailure, collective_guard, init_from_env

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

    from lmrepro.dist import cli, launch

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    flags = launch.args_to_flags({"optimizer": "topk", "batch_size": 4, "model": TINY,
                                  "resume": False, "corpus_dir": "c", "out": "o"})
    cfg = cli.config_from_args(parser.parse_args(["train-scape", *flags]))
    assert cfg.optimizer == "topk" and cfg.sparsity == 0.99 and cfg.batch_size == 4
    assert cfg.model == TINY and cfg.resume is False
    cmd = launch.torchrun_command(2, ["--x"], nnodes=2, node_rank=1, rdzv_endpoint="h:29500")
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "h:29500" and "--standalone" not in cmd
    assert "train-scape" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"

    runs, common, world = launch.suite_from_section(
        {"world_size": 3, "steps": 5, "corpus": "x", "runs": [{"name": "a", "optimizer": "adamw"},
                                                              {"name": "b", "optimizer": "adams"}]},
        TINY, seed=7)
    assert world == 3 and len(runs) == 2
    assert common == {"steps": 5, "corpus": "x", "model": TINY, "seed": 7}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text("{}")
    launched = []
    monkeypatch.setattr(launch, "launch_train_scape",
                        lambda corpus, out, w, args, **kw: launched.append((out.name, args)))
    dirs = launch.run_scape_suite("corpus", tmp_path, runs, world, common)
    assert [d.name for d in dirs] == ["a", "b"]
    assert [name for name, _ in launched] == ["b"] and launched[0][1]["steps"] == 5
    with pytest.raises(ParameterError, match="unique"):
        launch.run_scape_suite("corpus", tmp_path, [{"name": "a"}, {"name": "a"}], 2, {})
