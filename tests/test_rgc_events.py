"""The async executor is asynchronous, shown on its own clock: every worker's timestamped
compute events (lmrepro.rgc.executors.events), and the (step, micro-batch, stage) tag each message
between workers carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lmrepro.errors import ParameterError
from lmrepro.lifetime import FAULT_ENV
from lmrepro.rgc import RGCConfig, StageWorkerError, train
from lmrepro.rgc.executors import events as ev
from lmrepro.rgc.executors.wire import MessageMismatch, tagged, untag

torch.set_num_threads(1)

TEXT = (b"The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. ") * 80
DATA = np.frombuffer(TEXT, dtype=np.uint8).copy()
TRAIN, VAL = DATA[:5000], DATA[5000:]
STEPS, M = 6, 2


def cfg(**kw) -> RGCConfig:
    base = dict(model=dict(n_layers=4, d_model=16, n_heads=2, context=16), n_stages=4,
                horizon=2, steps=STEPS, batch_size=4, micro_batches=M, warmup_steps=2, lr=3e-3,
                eval_batch_size=4, eval_batches=2, checkpoint_every=0, stages_per_worker=[2, 2],
                threads=[1, 1], backprop_threads=1, timeout_s=60.0)
    base.update(kw)
    return RGCConfig(**base)


def test_overtakes_reads_the_spans_of_neighbouring_workers() -> None:
    """Worker 0 starts step 1's forward at 15, worker 1 ends step 0's backward at 20: an
    overtake; moved after 20 it is none."""
    def rows(start: int) -> list[ev.Event]:
        return [ev.Event(0, 0, "forward", 0, 0, 0, 0, 5), ev.Event(0, 0, "forward", 1, 0, 1,
                                                                  start, start + 5),
                ev.Event(1, 1, "forward", 0, 0, 0, 6, 8), ev.Event(1, 1, "backward", 0, 0, 0,
                                                                   9, 20)]
    assert ev.overtakes(rows(15), 2, 2) == [(0, 0)]
    assert ev.overtakes(rows(21), 2, 2) == []


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1])
def test_running_ahead_overtakes_and_lockstep_never_does(staleness: int, tmp_path: Path
                                                         ) -> None:
    """H = 2 on two workers of two stages. Running ahead (s = 1), worker 0 starts step t+1's
    forward before worker 1 has finished step t's backward; in lockstep (s = 0) never. Each
    stage's forward ran once per step and micro-batch, its backward once per graph whose
    gradient came back, ``stage_gradient_delays[k]`` steps after the graph was built."""
    c = cfg(consensus_staleness=staleness)
    r = train(c, "async", TRAIN, VAL, tmp_path / "run")
    events = r.events
    assert events == ev.read(tmp_path / "run")           # the run directory holds the same
    found = ev.overtakes(events, c.n_workers, c.steps)
    if staleness == 0:
        assert found == [], found
    else:
        assert found, "no worker ran ahead of the one above it"
    delays = c.stage_gradient_delays
    assert delays == ([0] * 4 if staleness == 0 else [1, 1, 0, 0])
    for k in range(c.n_stages):
        fwd = sorted((e.step, e.micro_batch) for e in events
                     if e.stage == k and e.phase == "forward")
        assert fwd == [(t, m) for t in range(STEPS) for m in range(M)]
        back = [e for e in events if e.stage == k and e.phase == "backward"]
        assert sorted((e.step, e.micro_batch) for e in back) == \
            [(t, m) for t in range(STEPS - delays[k]) for m in range(M)]
        assert {e.at - e.step for e in back} == {delays[k]}
        assert all(e.start_ns <= e.end_ns for e in back)


@pytest.mark.slow
@pytest.mark.parametrize("point, stage, what", [
    ("rgc-stage1-mislabel@2", 2, "step 2 micro-batch 0 activations from stage 1: received a "
     "message tagged (step 3, micro-batch 0, stage 1), expected (step 2, micro-batch 0, "
     "stage 1)"),
    ("rgc-stage2-backward-mislabel@2", 1, "step 2 micro-batch 0 gradient from stage 2: received "
     "a message tagged (step 3, micro-batch 0, stage 2), expected (step 2, micro-batch 0, "
     "stage 2)"),
])
def test_a_message_with_another_steps_tag_stops_the_run_naming_both(
        point: str, stage: int, what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender tags its step-2 messages with step 3 (a slip in the lag or a resend): the
    receiver refuses them, naming the tag it got and the one it expected."""
    monkeypatch.setenv(FAULT_ENV, point)
    with pytest.raises(StageWorkerError) as ei:
        train(cfg(), "async", TRAIN, VAL)
    assert ei.value.stage == stage
    assert "MessageMismatch" in str(ei.value) and what in str(ei.value)


def test_a_mislabel_fault_of_a_stage_that_sends_nothing_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "rgc-stage0-mislabel@1")
    with pytest.raises(ParameterError, match=r"rgc-stage0-mislabel@1.*one of \[1\]"):
        train(cfg(), "async", TRAIN, VAL)
    monkeypatch.setenv(FAULT_ENV, "rgc-stage1-backward-mislabel@1")
    with pytest.raises(ParameterError, match=r"sends gradients.*one of \[2\]"):
        train(cfg(), "async", TRAIN, VAL)


def test_untag_returns_the_payload_of_the_expected_tag_only() -> None:
    item = tagged(4, 1, 2, (torch.ones(2), torch.zeros(1, dtype=torch.long)))
    x, y = untag(item, 4, 1, 2, "here")
    assert torch.equal(x, torch.ones(2)) and y.dtype == torch.long
    with pytest.raises(MessageMismatch, match=r"^here: received a message tagged \(step 4, "
                       r"micro-batch 1, stage 2\), expected \(step 4, micro-batch 0, stage 2\)$"):
        untag(item, 4, 0, 2, "here")
