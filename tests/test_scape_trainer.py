"""The torchrun trainer: results layout, kill -9 + resume bit-identity, bounded failure when a
peer dies or stalls, and bad input. Everything on gloo, 127.0.0.1, tiny models."""

from __future__ import annotations

import os
import time

import pytest
import torch

from _dist_helpers import run_workers, write_tiny_corpus
from lmrepro.errors import ParameterError
from lmrepro.io import read_json, read_jsonl, torch_load
from lmrepro.lifetime import FAULT_ENV
from lmrepro.results import read_run

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "context": 32}
COMMON = dict(steps=12, batch_size=4, lr=3e-3, warmup_steps=3, eval_batches=2, eval_batch_size=4,
              timeout_s=20)
SEED = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _run(corpus, out, optimizer, sparsity=0.0, **kw):
    """``(settings, run, model, target)`` of one run, for
    :func:`lmrepro.scape.train.trainer.train`."""
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun
    from lmrepro.scape.train.trainer import RunTarget

    return (ScapeConfig(**{**COMMON, **kw}), ScapeRun(optimizer=optimizer, sparsity=sparsity),
            ModelConfig(**TINY), RunTarget(corpus_dir=str(corpus), out=str(out), seed=SEED))


METHODS = [("adamw", 0.0, {}), ("adams", 0.0, {}), ("topk", 0.99, {}),
           ("topk", 0.99, {"topk_inner": "adamw"}), ("scape", 0.9, {}),
           ("scape", 0.9, {"mask_rule": "stale_m"})]


@pytest.mark.parametrize("optimizer,sparsity,variant", METHODS)
def test_single_process_run_layout(corpus, tmp_path, monkeypatch, optimizer, sparsity, variant):
    """World of one without torchrun (local collectives); results in the lmrepro.results layout
    with the sparse methods' sparsity, coverage and residual per step."""
    from lmrepro.scape.train.trainer import train

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    settings, run, model, target = _run(corpus, tmp_path / "run", optimizer, sparsity, steps=6,
                                        sparsity_warmup_steps=2, dense_steps=1)
    run = run.replace(**variant, lr=2e-3)
    out = train(settings, run, model, target)
    r = read_run(out)
    s = r["summary"]
    for key in ("name", "method", "corpus", "steps", "tokens", "final_bpb", "tokens_per_s",
                "mean_step_time_s", "peak_rss_bytes", "seed", "processes", "bytes_per_step"):
        assert key in s, key
    assert s["details"]["sparsity"] == sparsity              # ScapeDetails, the wing's setting
    assert s["method"] == run.method.value and s["processes"] == 1 and s["steps"] == 6
    assert s["tokens"] == 6 * 4 * 32 and s["diverged_at_step"] is None
    assert len(r["eval_losses"]) == 2 and 0 < s["final_bpb"] < 9
    assert s["details"]["lr"] == 2e-3 and s["config"]["settings"]["max_grad_norm"] == 1.0
    steps = [x for x in r["metrics"] if "loss" in x]
    assert [x["step"] for x in steps] == list(range(6))
    assert set(s["bytes_per_step"]) == {"grad_values", "param_values", "mask", "total"}
    assert all(x["grad_norm"] > 0 for x in steps)
    if optimizer in ("adamw", "adams"):
        n = sum(p.numel() for p in torch_load(out / "model_final.pt")["model"].values())
        assert steps[-1]["bytes_grad_values"] == 4 * n and steps[-1]["bytes_mask"] == 0
        assert "coverage" not in steps[-1]
    else:
        assert all(0 <= x["sparsity"] < 1 and x["residual_norm"] >= 0 for x in steps)
        assert 0 < steps[-1]["coverage"] <= 1 and s["details"]["final_coverage"] > 0
    if optimizer == "scape":                # the schedule: 1 dense step, then 1 -> 0.1 over 2
        assert steps[0]["sparsity"] == 0.0 and steps[0]["coverage"] == 0.0
        assert steps[-1]["sparsity"] > steps[2]["sparsity"] > 0.0
        # counted from the target sparsity on (step 3): fewer coordinates than while warming up
        assert steps[2]["coverage_at_target"] == 0.0
        assert 0 < steps[-1]["coverage_at_target"] < steps[-1]["coverage"]
    # a finished run is skipped, not retrained
    mtime = (out / "summary.json").stat().st_mtime_ns
    train(settings, run, model, target)
    assert (out / "summary.json").stat().st_mtime_ns == mtime


def test_divergence_is_recorded_not_raised(corpus, tmp_path, monkeypatch):
    """A non-finite loss stops the run where it happens: the summary says so (no final_bpb), the
    step before is the last logged, and train() returns normally so a suite goes on."""
    from lmrepro.scape.train.trainer import train

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(FAULT_ENV, "scape-nan-loss@3:rank0")
    out = train(*_run(corpus, tmp_path / "run", "scape", 0.9, steps=6))
    s = read_json(out / "summary.json")
    assert s["diverged_at_step"] == 3 and s["final_bpb"] is None
    assert not (out / "eval_losses.json").exists() and not (out / "model_final.pt").exists()
    rows = [x for x in read_jsonl(out / "metrics.jsonl")]
    assert [x["step"] for x in rows if "loss" in x] == [0, 1, 2]
    assert "must be finite" in rows[-1]["diverged"]


def test_bad_input(corpus, tmp_path):
    from lmrepro.scape.train.trainer import train

    with pytest.raises(ParameterError, match="sparsity.*dense"):
        train(*_run(corpus, tmp_path / "a", "adamw", 0.9))
    with pytest.raises(ParameterError, match=r"sparsity = 1.0.*less than 1"):
        train(*_run(corpus, tmp_path / "b", "scape", 1.0))
    with pytest.raises(ParameterError, match="corpus_dir"):
        train(*_run(tmp_path / "nothing", tmp_path / "c", "scape", 0.9))
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
    from lmrepro.scape.config import ScapeConfig, ScapeRun

    with pytest.raises(ParameterError, match=r"mask_rule = 'stale_m': applies to optimizer "
                                             r"'scape' only"):
        ScapeRun(optimizer="topk", sparsity=0.9, mask_rule="stale_m")
    with pytest.raises(ParameterError, match=r"topk_inner = 'adamw': applies to optimizer"):
        ScapeRun(optimizer="scape", sparsity=0.9, topk_inner="adamw")
    with pytest.raises(ParameterError, match=r"scape\.runs\[\]\.lr = 0\.0"):
        ScapeRun(optimizer="adamw", lr=0.0)
    with pytest.raises(ParameterError, match=r"scape\.sparsity_start = 1\.0"):
        ScapeConfig(sparsity_start=1.0)
    with pytest.raises(ParameterError, match=r"scape\.sparsity_warmup_steps = -1"):
        ScapeConfig(sparsity_warmup_steps=-1)
    with pytest.raises(ParameterError, match=r"scape\.max_grad_norm = 0\.0"):
        ScapeConfig(max_grad_norm=0.0)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_kill_worker_then_resume_is_bit_identical(corpus, tmp_path):
    """kill -9 of rank 1 mid-run (after a checkpoint), torchrun tears the job down; relaunching
    resumes from the checkpoint and ends with exactly the uninterrupted run's parameters,
    per-step losses and eval losses."""
    from lmrepro.scape.train.launch import launch_train_scape

    cfg, run, model, _ = _run(corpus, tmp_path, "scape", 0.9, checkpoint_every=4,
                              dense_steps=1, sparsity_warmup_steps=4)
    args = (cfg, run, model)
    ref = launch_train_scape(corpus, tmp_path / "ref", 2, *args, seed=SEED, timeout_s=100)

    t0 = time.monotonic()
    killed = launch_train_scape(corpus, tmp_path / "killed", 2, *args, seed=SEED, timeout_s=100,
                                env={FAULT_ENV: "scape-step@7:rank1"}, check_exit=False)
    assert time.monotonic() - t0 < 60
    assert not (killed / "summary.json").exists()
    assert read_json(killed / "checkpoints" / "latest.json")["step"] == 4
    log = (killed / "launch.log").read_text()
    assert "rank      : 1" in log and "SIGKILL" in log
    done = launch_train_scape(corpus, killed, 2, *args, seed=SEED, timeout_s=100)
    assert "resuming" in (done / "launch.log").read_text()

    a, b = read_run(ref), read_run(done)
    keys = ("step", "loss", "lr", "bytes_grad_values", "bytes_param_values", "bytes_mask",
            "sparsity", "coverage", "coverage_at_target", "residual_norm", "grad_norm")
    rows_a = [{k: r[k] for k in keys} for r in a["metrics"] if "loss" in r]
    rows_b = [{k: r[k] for k in keys} for r in b["metrics"] if "loss" in r]
    assert len(rows_a) == 12 and rows_a == rows_b
    assert a["eval_losses"] == b["eval_losses"]
    assert a["summary"]["final_bpb"] == b["summary"]["final_bpb"]
    ma = torch_load(ref / "model_final.pt")["model"]
    mb = torch_load(done / "model_final.pt")["model"]
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    # SCAPE at 90 % really sent less than dense after its dense step
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
    from lmrepro.scape import cli
    from lmrepro.scape.train import launch, worker
    from lmrepro.scape.config import ScapeConfig, ScapeRun, ScapeSuite

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    cfg, run, model, _ = _run("c", "o", "topk", 0.99, batch_size=4, eps=1e-7)
    argv = worker.worker_argv(cfg, run, model, "c", "o", seed=7)
    args = parser.parse_args(["train-scape", *argv, "--no-resume"])
    # the flags are generated from the configuration classes: a lossless round trip
    from lmrepro.config import from_arguments
    assert from_arguments(ScapeConfig, args) == cfg
    assert from_arguments(ScapeRun, args, exclude=worker.RUN_OWN) == run   # they came as --lr, ...
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
    assert "lmrepro.scape.train.worker" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"

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


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_divergence_on_one_rank_under_torchrun(corpus, tmp_path):
    """Rank 1's loss turns NaN: every rank stops at that step (the optimizer raises on all of
    them at once), the job exits 0 and the summary records the divergence."""
    from lmrepro.scape.train.launch import launch_train_scape

    cfg, run, model, _ = _run(corpus, tmp_path, "topk", 0.99, steps=8)
    out = launch_train_scape(corpus, tmp_path / "div", 2, cfg, run, model, seed=SEED,
                             timeout_s=100, env={FAULT_ENV: "scape-nan-loss@5:rank1"})
    s = read_json(out / "summary.json")
    assert s["diverged_at_step"] == 5 and s["final_bpb"] is None and s["processes"] == 2


FOREIGN = """
# A nanoGPT-style training script that knows nothing of lmrepro but its optimizer.
import json, os, sys
import torch, torch.distributed as dist
from lmrepro.optim import SCAPE

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
optimizer = SCAPE([{"params": decay, "weight_decay": 0.1},
                   {"params": no_decay, "weight_decay": 0.0}],
                  lr=3e-2, betas=(0.9, 0.95), sparsity=0.9)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=30, eta_min=3e-3)
gen = torch.Generator().manual_seed(100 + rank)
losses = []
for it in range(30):
    x = torch.randint(0, 32, (16, 8), generator=gen)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), ((x * 7 + 3) % 32).reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(every, flat)
if rank == 0:
    print("RESULT " + json.dumps({
        "replicas_identical": all(torch.equal(f, flat) for f in every),
        "first": sum(losses[:5]) / 5, "last": sum(losses[-5:]) / 5,
        "lrs": [g["lr"] for g in optimizer.param_groups], "steps": optimizer.num_steps}))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_foreign_nanogpt_script_under_torchrun(tmp_path):
    """Two parameter groups, a CosineAnnealingLR and clip_grad_norm_ around SCAPE, 2 gloo
    workers under torchrun: it trains, the schedule reaches the optimizer, replicas agree."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train_foreign.py"
    script.write_text(FOREIGN)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script)], env=env, capture_output=True,
                          text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert res["replicas_identical"] and res["steps"] == 30
    assert res["last"] < 0.8 * res["first"]
    assert res["lrs"] == pytest.approx([3e-3, 3e-3])


def test_evaluations_along_a_wsd_run_change_none_of_its_numbers(corpus, tmp_path):
    """``eval_at``: rank 0 scores the validation and test splits after the listed step counts
    (a loss curve); the run's per-step losses, lrs and final model equal a run without them, and
    the wsd schedule holds its lr until the decay."""
    from lmrepro.scape.train.launch import launch_train_scape

    cfg, run, model, _ = _run(corpus, tmp_path, "scape", 0.9, lr_schedule="wsd",
                              decay_fraction=0.25, sparsity_warmup_steps=3)
    plain = launch_train_scape(corpus, tmp_path / "plain", 2, cfg, run, model, seed=SEED,
                               timeout_s=100)
    curve = launch_train_scape(corpus, tmp_path / "curve", 2, cfg.replace(eval_at=[2, 5, 8]),
                               run, model, seed=SEED, timeout_s=100)
    a, b = read_run(plain), read_run(curve)
    steps_a = [(r["step"], r["loss"], r["lr"]) for r in a["metrics"] if "loss" in r]
    steps_b = [(r["step"], r["loss"], r["lr"]) for r in b["metrics"] if "loss" in r]
    assert steps_a == steps_b
    points = [r for r in b["metrics"] if "test_bpb" in r]
    assert [r["step"] + 1 for r in points] == [2, 5, 8]
    assert all(r["eval_bpb"] > 0 and r["test_bpb"] > 0 for r in points)
    assert [lr for _, _, lr in steps_a[3:9]] == [COMMON["lr"]] * 6      # stable until the decay
    assert steps_a[-1][2] < COMMON["lr"]
    fa, fb = torch_load(plain / "model_final.pt"), torch_load(curve / "model_final.pt")
    assert all(torch.equal(fa["model"][k], fb["model"][k]) for k in fa["model"])
