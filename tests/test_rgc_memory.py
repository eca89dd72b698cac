"""Memory measured clean (issue 29, item 4): every run of the RGC suite in a fresh process tree
of its own, with the same results; the evaluation copy and the hand-over outside the run's peak,
each its own row; the byte account explaining the excess that remains."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmrepro.memory_phases import END, EVALUATION, START, TRAINING, PhasedSampler
from lmrepro.results import read_run
from lmrepro.rgc.analysis.byte_account import explain_excess
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.executors.runner import train
from lmrepro.rgc.stage import run_executors

TEXT = (b"It is a truth universally acknowledged, that a single man in possession of a good "
        b"fortune, must be in want of a wife. ") * 60
DATA = np.frombuffer(TEXT, dtype=np.uint8).copy()
TRAIN, VAL = DATA[:5000], DATA[5000:]
MIB = 2**20


def cfg(**kw: object) -> RGCConfig:
    base: dict[str, object] = dict(
        model=dict(n_layers=4, d_model=16, n_heads=2, context=16), n_stages=2, horizon=1,
        steps=3, batch_size=4, micro_batches=2, warmup_steps=1, lr=3e-3, eval_batch_size=4,
        eval_batches=3, checkpoint_every=0, threads=(1, 1), backprop_threads=1)
    base.update(kw)
    return RGCConfig(**base)  # type: ignore[arg-type]


def test_each_run_of_a_suite_runs_in_its_own_fresh_process_tree(tmp_path: Path) -> None:
    """Two measured runs never share a parent process: each summary names the root of its
    tree, all differ, none is this process, and each was started for its run alone. Training
    there changes nothing: the same losses as in this process, bit for bit."""
    c = cfg(eval_every=2)
    out = run_executors(TRAIN, VAL, "austen", tmp_path / "fresh", c,
                        executors=("async", "sync", "backprop"))
    trees = {e: s["details"]["process_tree"] for e, s in out.items()}
    roots = [t["root_pid"] for t in trees.values()]
    assert len(set(roots)) == len(roots), trees
    assert os.getpid() not in roots
    assert all(t["fresh"] and t["launcher_pid"] == os.getpid() for t in trees.values()), trees
    for executor in ("sync", "backprop"):
        here = train(c, executor, TRAIN, VAL, tmp_path / "here" / executor, corpus="austen")
        there = read_run(tmp_path / "fresh" / ("rgc-sync" if executor == "sync"
                                               else "backprop"))
        assert there["eval_losses"] == here.eval_losses, executor
        assert [r.get("loss") for r in there["metrics"]] == [r.get("loss") for r in here.metrics]
        assert here.summary["details"]["process_tree"]["fresh"] is False
    # the run's peak is its training phase's; the others are rows of their own
    for executor, s in out.items():
        phases = s["details"]["memory_phases"]
        assert s["peak_rss_bytes"] == phases[TRAINING]["rss"], executor
        assert s["peak_pss_bytes"] == phases[TRAINING]["pss"], executor
        assert {TRAINING, EVALUATION, END} <= set(phases), (executor, phases)
        assert "evaluation copy" in s["details"]["memory_attributed"]
    assert START in out["async"]["details"]["memory_phases"]


def test_a_failure_in_the_fresh_process_is_raised_here(tmp_path: Path) -> None:
    from lmrepro.errors import ParameterError

    with pytest.raises(ParameterError, match="train_data"):
        run_executors(TRAIN[:10], VAL, "austen", tmp_path, cfg(), executors=("sync",))


def test_the_evaluation_copy_and_the_hand_over_are_not_the_runs_peak() -> None:
    """What a phase holds counts in its own row and in the overall peak, not in training's."""
    sampler = PhasedSampler(interval_s=0.01).start()
    try:
        base = sampler.sample()
        with sampler.phase(EVALUATION):
            copy = np.ones(48 * MIB // 8)          # an evaluation copy of 48 MiB
            sampler.sample()
            del copy
        sampler.set_phase(END)
        handed = np.ones(64 * MIB // 8)            # the final state handed over
        sampler.sample()
    finally:
        sampler.stop()
    del handed
    training = sampler.phase_peak(TRAINING)
    assert training is not None and training.rss < base.rss + 16 * MIB
    assert sampler.phase_peaks[EVALUATION].rss > base.rss + 40 * MIB
    assert sampler.phase_peaks[END].rss > base.rss + 56 * MIB
    assert sampler.peak.rss == max(m.rss for m in sampler.phase_peaks.values())
    assert set(sampler.phases()) == {TRAINING, EVALUATION, END}


def test_the_byte_account_explains_the_excess_with_the_rest_shown() -> None:
    c = cfg()
    mib = MIB
    runtimes = {"rss": 300 * mib, "pss": 120 * mib, "uss": 100 * mib}
    cand = {"peak_rss_bytes": 900 * mib, "peak_pss_bytes": 500 * mib, "processes": 2,
            "details": {"worker_runtimes_memory": runtimes}}
    base = {"peak_rss_bytes": 450 * mib, "peak_pss_bytes": 380 * mib, "processes": 1,
            "details": {}}
    for metric in ("rss", "pss"):
        rows = explain_excess(c, cand, base, metric)
        by = {r["what"]: r["bytes"] for r in rows}
        excess = cand[f"peak_{metric}_bytes"] - base[f"peak_{metric}_bytes"]
        assert by["measured excess"] == excess
        assert by["torch runtimes of the workers (measured)"] == runtimes[metric]
        # the rows add up: what is accounted plus the rest is the measured excess
        parts = [r["bytes"] for r in rows if r["what"] not in ("measured excess",)]
        assert sum(parts) == excess
        assert "unaccounted rest" in by
        assert {"activations_kept", "stashed_weights", "queued_copies"} <= set(by)
        assert "snapshot" not in by          # outside the training phase


def test_the_excess_table_reads_records_written_under_the_old_setting_names() -> None:
    """A published async run recorded ``threads_per_worker`` and ``worker_timeout_s`` (since
    renamed ``threads`` and ``timeout_s``); its byte account must still be computed, from the
    same settings."""
    from lmrepro.rgc.analysis.report import excess_table

    c = cfg()
    settings = {k: v for k, v in c.to_dict().items() if k != "model"}
    old = {("threads_per_worker" if k == "threads" else "worker_timeout_s" if k == "timeout_s"
            else k): v for k, v in settings.items()}
    assert "threads" not in old and "threads_per_worker" in old

    def record(executor: str, settings: dict, pss: int) -> dict:
        return {"method": "rgc" if executor == "async" else "backprop", "executor": executor,
                "corpus": "austen", "seed": 0, "peak_rss_bytes": pss + 100 * MIB,
                "peak_pss_bytes": pss, "processes": 2 if executor == "async" else 1,
                "details": {"executor": executor},
                "config": {"settings": settings, "model": c.model.to_dict()}}
    base = record("backprop", settings, 300 * MIB)
    new_rows = excess_table({"a": record("async", settings, 500 * MIB), "b": base})
    old_rows = excess_table({"a": record("async", old, 500 * MIB), "b": base})
    assert not old_rows.empty
    pd.testing.assert_frame_equal(old_rows, new_rows)
