"""Async RGC executor (one process per stage): correctness against sync, failures, resume."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lmrepro.results import latest_checkpoint, read_run
from lmrepro.rgc import RGCConfig, StageWorkerError, train

torch.set_num_threads(1)
pytestmark = pytest.mark.slow

TEXT = (b"The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. ") * 80
DATA = np.frombuffer(TEXT, dtype=np.uint8).copy()
TRAIN, VAL = DATA[:5000], DATA[5000:]


def cfg(**kw) -> RGCConfig:
    base = dict(n_layers=4, n_stages=2, horizon=1, d_model=16, n_heads=2, context=16, steps=5,
                batch_size=4, micro_batches=2, warmup_steps=2, lr=3e-3, eval_batch_size=4,
                eval_batches=3, checkpoint_every=2, threads_per_stage=(1, 1),
                backprop_threads=1, worker_timeout_s=60.0)
    base.update(kw)
    return RGCConfig(**base)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("async") / "run"
    return train(cfg(), "async", TRAIN, VAL, out, corpus="fox"), out


def test_async_matches_sync_math_and_writes_results(straight) -> None:
    r, out = straight
    s = read_run(out)["summary"]
    assert s["executor"] == "async" and s["method"] == "rgc" and s["threads"] == 2
    assert s["details"]["threads_per_process"] == [1, 1] and s["processes"] == 2
    assert r.tokens_per_s > 0
    # the whole process tree is measured: parent + 2 stage processes, each with torch loaded
    assert r.peak_rss_bytes > 3 * 100 * 2**20
    sync = train(cfg(), "sync", TRAIN, VAL)
    # same math (H = 1, same batches, same consensus); only summation order differs
    for n, v in sync.final_state.items():
        torch.testing.assert_close(r.final_state[n], v, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r.eval_losses, sync.eval_losses, rtol=1e-5)
    a = [m["stage_losses"] for m in r.metrics if "loss" in m]
    b = [m["stage_losses"] for m in sync.metrics if "loss" in m]
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_async_resume_continues_from_checkpoint(straight, tmp_path: Path) -> None:
    r, _ = straight
    part = train(cfg(), "async", TRAIN, VAL, tmp_path / "b", stop_after=3)
    assert latest_checkpoint(tmp_path / "b")["step"] == 2
    assert part.summary == {}
    resumed = train(cfg(), "async", TRAIN, VAL, tmp_path / "b")
    assert resumed.summary["resumed_from_step"] == 2
    assert [m["step"] for m in read_run(tmp_path / "b")["metrics"]] == list(range(5))
    for n, v in r.final_state.items():  # bit-identical on CPU with the same thread counts
        assert torch.equal(resumed.final_state[n], v), n
    assert resumed.eval_losses == r.eval_losses


@pytest.mark.parametrize("kind, stage, needle", [
    ("raise", 1, "injected fault in stage 1 at step 1"),
    ("exit", 0, "exited with code 3"),
])
def test_crashing_stage_stops_the_run_with_its_traceback(kind: str, stage: int, needle: str
                                                         ) -> None:
    t0 = time.monotonic()
    with pytest.raises(StageWorkerError) as ei:
        train(cfg(steps=4), "async", TRAIN, VAL, fault=(stage, 1, kind))
    assert ei.value.stage == stage
    assert f"stage {stage} failed" in str(ei.value) and needle in str(ei.value)
    if kind == "raise":
        assert "Traceback" in str(ei.value) and "_stage_worker" in str(ei.value)
    assert time.monotonic() - t0 < 50  # no hang: well under the 60 s worker timeout


def test_hanging_stage_times_out_instead_of_hanging() -> None:
    """Stage 0 stops producing: stage 1's queue get gives up after worker_timeout_s."""
    t0 = time.monotonic()
    with pytest.raises(StageWorkerError) as ei:
        train(cfg(steps=4, worker_timeout_s=8.0), "async", TRAIN, VAL, fault=(0, 1, "hang"))
    assert ei.value.stage == 1
    assert "TimeoutError" in str(ei.value) and "from stage 0" in str(ei.value)
    assert time.monotonic() - t0 < 40
