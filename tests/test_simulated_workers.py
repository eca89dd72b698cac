"""Workers simulated in one process (lmrepro.optim.local_group, lmrepro.scape.train.simulated)
against the torchrun path, the in-process group's collectives, the study's pure rules, and a
simulated run's resume."""

from __future__ import annotations

import shutil
from pathlib import Path
import threading

import pytest
import torch

from _dist_helpers import write_tiny_corpus
from lmrepro.io import read_json, read_jsonl

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "context": 32}
COMMON = dict(steps=10, lr=4e-3, warmup_steps=2, sparsity_warmup_steps=3, eval_batches=2,
              eval_batch_size=4, timeout_s=30)
SEED = 5
GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _spec(corpus, out, optimizer, sparsity, workers, **kw):
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun
    from lmrepro.scape.train.trainer import RunTarget

    return (ScapeConfig(**{**COMMON, "batch_size": GLOBAL_BATCH // workers, **kw}),
            ScapeRun(optimizer=optimizer, sparsity=sparsity), ModelConfig(**TINY),
            RunTarget(corpus_dir=str(corpus), out=str(out), seed=SEED))


def _losses(out) -> list[float]:
    return [r["loss"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]


def _simulated(corpus, out, optimizer, sparsity, workers, **kw):
    from lmrepro.scape.train.simulated import train_simulated

    cfg, run, model, target = _spec(corpus, out, optimizer, sparsity, workers, **kw)
    return train_simulated(cfg, run, model, target, workers, probe_every=2)


def _torchrun(corpus, out, optimizer, sparsity, workers):
    from lmrepro.scape.train.launch import launch_train_scape

    cfg, run, model, _ = _spec(corpus, out, optimizer, sparsity, workers)
    return launch_train_scape(corpus, out, workers, cfg, run, model, seed=SEED, timeout_s=300)


METHODS = [("adams", 0.0), ("scape", 0.9), ("topk", 0.9)]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("optimizer,sparsity", METHODS)
def test_simulated_equals_torchrun(corpus, tmp_path, optimizer, sparsity, workers):
    """The same per-step losses as torchrun's gloo workers: bit for bit at two workers (a sum of
    two is the same in any order), to fp32 rounding at four (the group sums in rank order)."""
    sim = _simulated(corpus, tmp_path / "sim", optimizer, sparsity, workers)
    real = _torchrun(corpus, tmp_path / "real", optimizer, sparsity, workers)
    a, b = _losses(sim), _losses(real)
    assert len(a) == len(b) == COMMON["steps"]
    if workers == 2:
        assert a == b
    else:
        assert a == pytest.approx(b, rel=1e-4, abs=0.0)
    assert read_json(sim / "summary.json")["bytes_per_step"] == \
        read_json(real / "summary.json")["bytes_per_step"]


def test_simulated_logs_what_one_process_sees(corpus, tmp_path):
    """Top-k logs the union of its workers' masks and their overlap; SCAPE the agreement of its
    owners' mask with the averaged view's, on the probed steps; all within their ranges."""
    topk = read_jsonl(_simulated(corpus, tmp_path / "t", "topk", 0.9, 4) / "metrics.jsonl")
    sparse = [r for r in topk if "union_sent" in r]
    assert sparse and all(0.0 <= r["pair_overlap"] <= 1.0 for r in sparse)
    scape = read_jsonl(_simulated(corpus, tmp_path / "s", "scape", 0.9, 4) / "metrics.jsonl")
    probed = [r for r in scape if "mask_agreement" in r]
    assert probed and all(0.0 <= r["mask_agreement"] <= 1.0 for r in probed)
    assert {r["step"] for r in probed} <= set(range(0, COMMON["steps"], 2))


def test_one_worker_agrees_with_itself(corpus, tmp_path):
    """With one worker the owner's view is the whole view: agreement 1 on every probe; and
    top-k's union is its one mask (overlap 1 by definition)."""
    rec = read_jsonl(_simulated(corpus, tmp_path / "s", "scape", 0.9, 1) / "metrics.jsonl")
    probed = [r["mask_agreement"] for r in rec if "mask_agreement" in r]
    assert len(probed) >= 3 and set(probed) == {1.0}


def test_simulated_resume_equals_uninterrupted(corpus, tmp_path):
    """A run resumed from its middle checkpoint (every worker's optimizer and batch stream
    restored) logs the uninterrupted run's losses bit for bit."""
    full = _simulated(corpus, tmp_path / "full", "scape", 0.9, 4, checkpoint_every=5)
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    for name in ("summary.json", "model_final.pt", "eval_losses.json", "test_losses.json"):
        (cut / name).unlink(missing_ok=True)
    resumed = _simulated(corpus, cut, "scape", 0.9, 4, checkpoint_every=5)
    assert read_json(resumed / "summary.json")["resumed_from_step"] == 5
    assert _losses(resumed) == _losses(full)


# -- the in-process group ----------------------------------------------------------------------
def _together(world, fn):
    from lmrepro.optim.local_group import LocalGroup

    group = LocalGroup(world, timeout_s=10)
    members = group.members()
    out, errors = [None] * world, []

    def body(r):
        try:
            out[r] = fn(members[r])
        except BaseException as exc:    # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out, errors


def test_group_collectives():
    """Sum in rank order, gather in rank order, broadcast from any rank, many in a row (the
    double buffer never mixes two collectives)."""
    def body(m):
        got = []
        for i in range(50):
            t = torch.tensor([float(m.rank + i)])
            m.all_reduce_(t)
            got.append(float(t))
            g = m.all_gather(torch.tensor([m.rank, i]))
            got.append(g.tolist())
            b = torch.tensor([m.rank * 10.0])
            m.broadcast_(b, src_rank=i % m.world)
            got.append(float(b))
        return got

    out, errors = _together(4, body)
    assert not errors
    for r in range(4):
        for i in range(50):
            s, g, b = out[r][3 * i:3 * i + 3]
            assert s == sum(k + i for k in range(4))
            assert g == [v for k in range(4) for v in (k, i)]
            assert b == (i % 4) * 10.0


def test_group_failure_breaks_the_others_waits():
    """A member that fails before a collective aborts the group: the others raise instead of
    waiting forever."""
    def body(m):
        if m.rank == 1:
            try:
                raise RuntimeError("worker 1 failed")
            finally:
                m.group.abort()
        m.all_reduce_(torch.zeros(1))

    _, errors = _together(3, body)
    assert len(errors) == 3
    assert sum(isinstance(e, threading.BrokenBarrierError) for e in errors) == 2


# -- pure rules --------------------------------------------------------------------------------
def test_pair_overlap():
    from lmrepro.scape.train.simulated import pair_overlap

    same = [torch.tensor([0, 1, 2])] * 3
    assert pair_overlap(same, 10) == 1.0
    assert pair_overlap([torch.tensor([0, 1]), torch.tensor([2, 3])], 10) == 0.0
    # pairs: (a,b) share 1 of 2, (a,c) 0, (b,c) 1: mean 2 / (3 * 2)
    got = pair_overlap([torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([2, 3])], 10)
    assert got == pytest.approx(2 / 6)


def test_nearest_swept_and_settings():
    from lmrepro.scape.config import ScapeConfig, WorkersStudy
    from lmrepro.scape.study.workers import nearest_swept, settings_at

    assert [nearest_swept(w, [2, 16]) for w in (2, 4, 8, 16)] == [2, 2, 16, 16]
    assert nearest_swept(4, [2, 8]) == 2                    # a tie goes to the smaller
    study = WorkersStudy(model={}, steps=3000, global_batch=16, workers=[2, 4], seeds=[0],
                         runs=[{"optimizer": "adams"}], sweep_workers=[2],
                         sweep_factors=[0.5, 1.0, 2.0])
    got = settings_at(ScapeConfig(), study, 4)
    assert (got.steps, got.batch_size, got.warmup_steps, got.sparsity_warmup_steps) == \
        (3000, 4, 150, 300)


def test_study_section_errors():
    from lmrepro.errors import ConfigError, ParameterError
    from lmrepro.scape.config import WorkersStudy

    ok = dict(model={}, steps=10, global_batch=16, workers=[2, 4], seeds=[0],
              runs=[{"optimizer": "adams"}], sweep_workers=[2], sweep_factors=[0.5, 1.0, 2.0])
    WorkersStudy(**ok)
    for bad, key in (({"workers": [2, 3]}, "workers"), ({"sweep_workers": [8]}, "sweep_workers"),
                     ({"sweep_seed": 0}, "sweep_seed"), ({"sweep_factors": [1, 2, 4.5, 3]},
                                                         "sweep_factors")):
        with pytest.raises((ParameterError, ConfigError, ValueError)) as err:
            WorkersStudy(**{**ok, **bad})
        assert key in str(err.value)


def test_finished_run_of_other_settings_is_refused(corpus, tmp_path):
    """A finished run directory whose job differs from the one asked for is an error naming it,
    never silently reused."""
    from dataclasses import replace

    from lmrepro.errors import ParameterError
    from lmrepro.scape.study.workers import Job, train_job

    cfg, run, model, _ = _spec(corpus, tmp_path / "r", "adams", 0.0, 2, steps=3)
    job = Job(cfg.to_dict(), run.to_dict(), model.to_dict(), str(corpus), "tiny",
              str(tmp_path / "r"), SEED, 2, 0)
    train_job(job)
    assert train_job(job) == str(tmp_path / "r")            # the same job: reused
    with pytest.raises(ParameterError, match="other settings"):
        train_job(replace(job, seed=SEED + 1))


# -- the study's analysis ------------------------------------------------------------------------
def test_wire_bytes_of_ring_collectives():
    """All-reduce moves 2 (W - 1) / W of the hand-in, all-gather W - 1 times it; SCAPE's mask
    travels in an all-gather, its values in an all-reduce; top-k gathers both."""
    from lmrepro.scape.study.workers_report import wire_bytes

    assert wire_bytes("adams", {"grad_values": 400.0, "mask": 0.0}, 2) == 400.0
    assert wire_bytes("adams", {"grad_values": 400.0}, 4) == 600.0
    assert wire_bytes("scape", {"grad_values": 40.0, "mask": 10.0}, 4) == 60.0 + 30.0
    assert wire_bytes("topk", {"grad_values": 40.0, "mask": 10.0}, 4) == 150.0
    assert wire_bytes("topk", {"grad_values": 40.0, "mask": 10.0, "total": 50.0}, 1) == 0.0


def test_holm_adjusts_step_down():
    from lmrepro.scape.study.workers_report import holm

    # sorted p 0.01, 0.02, 0.04 -> 0.03, 0.04, 0.04 (monotone), back in the given order
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_gap_and_pair_tables_from_known_runs(tmp_path):
    """Gaps come from the package's paired test (per seed the mean relative difference over the
    test batches) against AdamS at the same W; the change of a difference across W is per seed;
    Holm's p is never below the raw one, Bonferroni's bounds never inside the raw ones."""
    import numpy as np
    import pandas as pd

    from _runs import base_losses, make_run
    from lmrepro.results import write_eval_losses
    from lmrepro.scape.study.workers_report import gap_table, pair_table
    from lmrepro.stats import StatsConfig

    rows = []
    rel = {"adams": lambda w, s: 0.0, "scape90": lambda w, s: 0.02,
           "topk90": lambda w, s: 0.01 + (0.01 if w == 4 else 0.0) + 0.001 * s}
    for w in (2, 4):
        for s in range(3):
            b = base_losses(s)
            for name, f in rel.items():
                losses = b * (1.0 + f(w, s))
                d = make_run(tmp_path / f"W{w}" / f"seed{s}", name, "adams", seed=s,
                             losses=list(losses),
                             details={"final_test_bpb": float(np.mean(losses)) / np.log(2)})
                write_eval_losses(d, list(losses), 8, 64, split="test")
                rows.append({"workers": w, "seed": s, "run": name, "path": str(d)})
    stats = StatsConfig(n_resamples=200)
    g = gap_table(pd.DataFrame(rows), stats).set_index(["workers", "run"])
    assert g.loc[(2, "scape90"), "gap_pct"] == pytest.approx(2.0)
    assert g.loc[(2, "scape90"), "seeds"] == 3
    assert g.loc[(4, "topk90"), "gap_pct"] == pytest.approx(2.1)
    assert (g.p_holm >= g.p_two_sided - 1e-12).all()
    assert (g.bonferroni_lower_pct <= g.lower_pct + 1e-9).all()
    pairs = pair_table(pd.DataFrame(rows), stats).set_index(["contrast", "workers"])
    change = pairs.loc[("change of (topk90 vs scape90) from W=2", 4)]
    assert change.seeds == 3
    assert change.gap_pct == pytest.approx(100 * 0.01 / 1.02, rel=1e-6)


def test_tiny_study_end_to_end_and_its_bundle(corpus, tmp_path):
    """The study trains its sweep (an edge winner extended), then every verdict run; its
    analysis writes the tables; the tables recompute from what a publication holds (summaries,
    runs.csv, sweep.json), and a changed run is caught."""
    import pandas as pd

    from lmrepro.scape.config import ScapeSuite
    from lmrepro.scape.study.workers import run_workers_study
    from lmrepro.scape.study.workers_report import section_markdown, write_analysis
    from lmrepro.scape.study.workers_review import ANALYSIS, STAGE, bundle_tables

    corpus = Path(corpus)
    suite = ScapeSuite(corpus=corpus.name, runs=[{"optimizer": "adams"}], eval_batches=2,
                       eval_batch_size=4, workers={
                           "model": TINY, "steps": 6, "global_batch": 4, "workers": [1, 2],
                           "seeds": [0, 1], "sweep_workers": [2], "sweep_factors": [0.5, 1, 2],
                           "max_extensions": 1, "parallel": 1, "probe_every": 2,
                           "runs": [{"name": "adams", "optimizer": "adams", "lr": 1e-4},
                                    {"name": "topk90", "optimizer": "topk", "sparsity": 0.9,
                                     "lr": 1e-4}]})
    pub = tmp_path / "pub"
    dirs = run_workers_study(suite, corpus.parent, pub / STAGE)
    assert len(dirs) == 2 * 2 * 2
    sweep = pub / STAGE / "sweep" / "W2" / "seed1000"
    # lr 1e-4 is far too small for 6 steps: the largest wins, and is extended once
    assert len(list(sweep.glob("adams@lr*"))) == 4
    from lmrepro.stats import StatsConfig

    stats = StatsConfig(n_resamples=200)
    tables = write_analysis(pub / STAGE, pub / ANALYSIS, stats)
    assert set(tables["gaps"].workers) == {1, 2}
    assert "topk90" in section_markdown(tables, "x")
    again = bundle_tables(pub, stats)
    numbers = ["workers", "seeds", "gap_pct", "lower_pct", "upper_pct", "p_two_sided",
               "p_holm", "bonferroni_lower_pct", "bonferroni_upper_pct"]
    pd.testing.assert_frame_equal(again["gaps"][numbers],
                                  pd.read_csv(pub / ANALYSIS / "gaps.csv")[numbers])
    pd.testing.assert_frame_equal(again["comm"], pd.read_csv(pub / ANALYSIS / "comm.csv"))
    runs = pd.read_csv(pub / ANALYSIS / "runs.csv")
    runs.loc[0, "test_bpb"] += 0.1
    runs.to_csv(pub / ANALYSIS / "runs.csv", index=False)
    with pytest.raises(Exception, match="published summary"):
        bundle_tables(pub, stats)


def test_simulated_refuses_bf16(corpus, tmp_path):
    from lmrepro.errors import ParameterError

    with pytest.raises(ParameterError, match="fp32"):
        _simulated(corpus, tmp_path / "b", "adams", 0.0, 2, precision="bf16")
