"""Decay branches (lmrepro.scape.study.branches): checkpoints kept out of the rotation at the
branch points, the branch's schedule against its formula, a branch against the full wsd run of
its length trained from scratch, and the refusals."""

from __future__ import annotations

import pytest
import torch

from _dist_helpers import write_tiny_corpus
from lmrepro.checkpoints import KEPT, Checkpoints
from lmrepro.errors import ParameterError
from lmrepro.harness import Schedule
from lmrepro.io import read_json, read_jsonl
from lmrepro.scape.config import ScapeConfig, ScapeRun
from lmrepro.scape.study.branches import (BRANCH, branch_decay_steps, branch_lr, branch_points,
                                          branch_settings, run_branch, seed_branch)

STABLE = dict(steps=1000, lr=4e-3, warmup_steps=50, sparsity_warmup_steps=100,
              lr_schedule="wsd", decay_fraction=0.1, min_lr_ratio=0.1)


@pytest.mark.parametrize("s", [100, 137, 345, 555, 900])
def test_branch_schedule_is_the_stable_run_then_its_own_linear_decay(s):
    stable = ScapeConfig(**STABLE)
    branch = branch_settings(stable, s)
    d = round(0.1 * s)
    assert branch.steps == s + d and branch_decay_steps(s, 0.1) == d
    a, b = Schedule.of(stable, 4e-3), Schedule.of(branch, 4e-3)
    for i in range(s):                      # warm-up and stable phase: the stable run's lr
        assert b(i) == a(i)
    for i in range(s, s + d):               # the decay: linear over the d steps after s
        want = 4e-3 * (1 - 0.9 * (i - s + 1) / d)
        assert b(i) == pytest.approx(want, rel=1e-12)
        assert branch_lr(i, s, 0.1, 4e-3, 0.1) == pytest.approx(want, rel=1e-12)
    assert b(s - 1) == 4e-3 and b(s) < 4e-3
    assert b(s + d - 1) == pytest.approx(4e-4, rel=1e-12)
    # the same settings otherwise: warm-ups in steps, sparsity schedule, lr
    assert branch.warmup_steps == 50 and branch.sparsity_warmup_steps == 100


def test_branch_settings_refuse_what_is_no_branch():
    with pytest.raises(ParameterError, match="branch point"):
        branch_settings(ScapeConfig(**STABLE), 901)          # in the stable run's decay
    with pytest.raises(ParameterError, match="branch point"):
        branch_settings(ScapeConfig(**STABLE), 99)           # inside the sparsity warm-up
    with pytest.raises(ParameterError, match="lr_schedule"):
        branch_settings(ScapeConfig(**{**STABLE, "lr_schedule": "cosine"}), 500)


def test_branch_points_are_log_spaced_over_the_stable_phase():
    pts = branch_points(12000, 0.1, 1200, 7)
    assert pts[0] == 1200 and pts[-1] == 10800 and len(pts) == 7
    ratios = [b / a for a, b in zip(pts, pts[1:])]
    assert max(ratios) / min(ratios) < 1.01
    with pytest.raises(ParameterError, match="branch first step"):
        branch_points(12000, 0.1, 10800, 7)


def test_kept_checkpoints_outlive_the_rotation(tmp_path):
    ck = Checkpoints(tmp_path, {"run": "x"}, steps=10, every=4, keep=frozenset({3, 6}))
    assert [d for d in range(1, 11) if ck.due(d)] == [3, 4, 6, 8]
    for step in (3, 4, 6, 8):
        ck.commit(step, {"w": step})
    assert sorted(p.name for p in ck.folder.glob("step_*")) == ["step_0000008"]
    for step in (3, 6):
        kept = ck.kept_dir(step)
        assert read_json(kept / KEPT) == {"step": step, "world_size": 1,
                                          "identity": {"run": "x"}}
        assert (kept / "rank0.pt").exists()
    assert not ck.kept_dir(4).exists()


# -- a branch against the full wsd run of its length ---------------------------------------------
TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "context": 32}
TINY_RUN = dict(steps=40, lr=4e-3, warmup_steps=2, sparsity_warmup_steps=3, eval_batches=2,
                eval_batch_size=4, timeout_s=30, batch_size=4, lr_schedule="wsd",
                decay_fraction=0.1, checkpoint_every=15)
SEED, WORKERS, AT = 5, 2, 20


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _train(corpus, out, cfg):
    from lmrepro.model import ModelConfig
    from lmrepro.scape.train.simulated import train_simulated
    from lmrepro.scape.train.trainer import RunTarget

    return train_simulated(cfg, ScapeRun(optimizer="scape", sparsity=0.9), ModelConfig(**TINY),
                           RunTarget(corpus_dir=str(corpus), out=str(out), seed=SEED), WORKERS)


def _losses(out):
    return {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r}


@pytest.mark.slow
def test_branch_ends_as_the_full_run_of_its_length(corpus, tmp_path):
    """A branch at step 20 of a 40-step stable run (decay 2 steps) logs the losses and scores
    the final model of a 22-step wsd run decaying over its last 2 steps, trained from scratch,
    bit for bit; it records its parent and branch point."""
    from lmrepro.model import ModelConfig

    stable = ScapeConfig(**TINY_RUN, eval_at=[5, 10], keep_checkpoints_at=[10, AT])
    parent = _train(corpus, tmp_path / "stable", stable)
    assert (parent / "kept_checkpoints" / f"step_{AT:07d}" / "rank0.pt").exists()
    full = _train(corpus, tmp_path / "full", branch_settings(stable, AT))
    out = run_branch(corpus, parent, tmp_path / "branch", stable,
                     ScapeRun(optimizer="scape", sparsity=0.9), ModelConfig(**TINY), AT, WORKERS,
                     seed=SEED, simulated=True)
    summary = read_json(out / "summary.json")
    assert summary["steps"] == 22 and summary["resumed_from_step"] == AT
    assert read_json(out / BRANCH)["branch_step"] == AT
    assert read_json(out / BRANCH)["decay_steps"] == 2
    want = _losses(full)
    assert _losses(out) == {i: want[i] for i in (20, 21)}
    assert {i: _losses(parent)[i] for i in range(AT)} == {i: want[i] for i in range(AT)}
    for name in ("eval_losses.json", "eval_losses_test.json"):
        assert read_json(out / name) == read_json(full / name)
    a, b = (torch.load(d / "model_final.pt", weights_only=True)["model"] for d in (out, full))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a branch of another run (another lr) is refused, and so is a point that kept nothing
    other = ScapeConfig(**{**TINY_RUN, "lr": 2e-3})
    from lmrepro.scape.train.simulated import ENGINE
    from lmrepro.scape.train.trainer import RunTarget, run_identity

    ident = run_identity(branch_settings(other, AT), ScapeRun(optimizer="scape", sparsity=0.9),
                         ModelConfig(**TINY), RunTarget(str(corpus), str(tmp_path / "x"), SEED),
                         WORKERS)
    with pytest.raises(ParameterError, match="settings.lr"):
        seed_branch(parent, tmp_path / "x", AT, {**ident, "engine": ENGINE})
    with pytest.raises(ParameterError, match="kept no checkpoint after step 15"):
        seed_branch(parent, tmp_path / "y", 15, ident)


def test_equal_final_table_and_headline_from_branch_rows():
    """The study's reading of its branches: per seed, the candidate's final loss on AdamS's
    final-loss curve; a length missing in one seed is left out; the headline is the longest."""
    import math

    import pandas as pd

    from lmrepro.scape.study import horizon

    rows = []
    for seed, k in ((0, 1.5), (1, 2.0), (2, 2.5)):
        for n in (1000, 2000, 4000, 8000):
            rows.append({"size": "2x64", "run": "adams", "seed": seed, "steps": n,
                         "test_bpb": 2.0 - 0.1 * math.log2(n / 1000)})
            rows.append({"size": "2x64", "run": "scape90", "seed": seed, "steps": 2 * n,
                         "test_bpb": 2.0 - 0.1 * math.log2(2 * n / (1000 * k))})
    rows.append({"size": "2x64", "run": "scape90", "seed": 0, "steps": 99, "test_bpb": 3.0})
    table = horizon.equal_final_table(pd.DataFrame(rows))
    assert list(table.candidate_steps) == [2000, 4000, 8000, 16000]     # 99: seed 0 only
    measured = table[table.measured]
    # inside AdamS's curve (1000 to 8000 steps) iff 1000 k <= n <= 8000 k for every seed's k
    assert list(measured.candidate_steps) == [4000, 8000]
    assert list(table.outside) == [1, 0, 0, 1]
    for r in measured.itertuples():
        assert r.per_seed == pytest.approx([1.5, 2.0, 2.5], rel=1e-9)
    head = horizon.equal_final_headline(table).iloc[0]
    assert head.candidate_steps == 16000 and not head.measured and head.outside == 1
    assert "not measured" in horizon.equal_final_text(head)
    lines = horizon.equal_final_lines(table)
    assert sum(line.startswith("| 2x64") and "not measured" in line for line in lines) == 2
