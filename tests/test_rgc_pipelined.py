"""The same-layout control (lmrepro.rgc.executors.pipelined): global backprop pipelined over the
async executor's worker processes computes what the backprop executor computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lmrepro.rgc import RGCConfig, train
from lmrepro.rgc.executors.pipelined import pipelined_config

torch.set_num_threads(1)
pytestmark = pytest.mark.slow

TEXT = (b"The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. ") * 80
DATA = np.frombuffer(TEXT, dtype=np.uint8).copy()
TRAIN, VAL = DATA[:5000], DATA[5000:]


def cfg(**kw) -> RGCConfig:
    base = dict(model=dict(n_layers=4, d_model=16, n_heads=2, context=16), n_stages=4,
                horizon=1, steps=5, batch_size=4, micro_batches=2, warmup_steps=2, lr=3e-3,
                eval_batch_size=4, eval_batches=3, checkpoint_every=2, stages_per_worker=[2, 2],
                threads=[1, 1], backprop_threads=1, timeout_s=60.0)
    base.update(kw)
    return RGCConfig(**base)


@pytest.mark.parametrize("stages_per_worker", [[2, 2], [1, 3]])
def test_pipelined_backprop_equals_the_backprop_executor(stages_per_worker: list[int],
                                                         tmp_path: Path) -> None:
    """Same per-step losses, evaluation and final weights as one-process global backprop, to
    float rounding; H and s of the suite do not change it; it runs on the async placement."""
    c = cfg(stages_per_worker=stages_per_worker, horizon=2, consensus_staleness=1)
    p = train(c, "pipelined_backprop", TRAIN, VAL, tmp_path / "p")
    b = train(c, "backprop", TRAIN, VAL)
    s = p.summary
    assert s["method"] == "backprop" and s["details"]["executor"] == "pipelined_backprop"
    assert s["processes"] == 2 and s["details"]["placement"] == c.placement
    assert s["config"]["settings"]["horizon"] == 4
    assert s["config"]["settings"]["consensus_staleness"] == 0
    lp = [m["loss"] for m in p.metrics if "loss" in m]
    lb = [m["loss"] for m in b.metrics if "loss" in m]
    assert len(lp) == c.steps and lp[0] != lp[-1]
    np.testing.assert_allclose(lp, lb, rtol=1e-5)
    np.testing.assert_allclose(p.eval_losses, b.eval_losses, rtol=1e-5)
    for n, v in b.final_state.items():
        torch.testing.assert_close(p.final_state[n], v, rtol=1e-4, atol=1e-6, msg=n)
    # only the last stage reads out: its events are the last worker's only
    assert {e.stage for e in p.events if e.phase == "readout"} == {3}
    # and it is not RGC: RGC's async run on the same layout trains other weights
    rgc = train(c, "async", TRAIN, VAL)
    assert not torch.allclose(rgc.final_state["blocks.0.attn.qkv.weight"],
                              p.final_state["blocks.0.attn.qkv.weight"])


def test_pipelined_backprop_resumes_bit_identically(tmp_path: Path) -> None:
    """Stopped after 3 steps (a checkpoint at 2) and resumed: the same weights as a run that
    was not interrupted; the decoder comes from the last worker's part."""
    c = cfg()
    full = train(c, "pipelined_backprop", TRAIN, VAL, tmp_path / "full")
    train(c, "pipelined_backprop", TRAIN, VAL, tmp_path / "r", stop_after=3)
    resumed = train(c, "pipelined_backprop", TRAIN, VAL, tmp_path / "r")
    assert resumed.summary["resumed_from_step"] == 2
    for n, v in full.final_state.items():
        assert torch.equal(resumed.final_state[n], v), n


def test_pipelined_config_runs_the_full_horizon_in_lockstep() -> None:
    c = pipelined_config(cfg(horizon=1, consensus_staleness=2, steps=10))
    assert c.horizon == 4 and c.consensus_staleness == 0 and not c.runs_ahead
