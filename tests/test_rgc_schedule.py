"""The ideal-step model of the async schedule (lmrepro.rgc.analysis.schedule), on hand-computed
cases."""

from __future__ import annotations

import pytest

from lmrepro.errors import ParameterError
from lmrepro.rgc.analysis.schedule import WorkerTimes, busy_step, ideal_step_time, simulate


def test_one_worker_is_its_own_compute_plus_the_consensus() -> None:
    t = WorkerTimes(pre_send=1.0, post_send=2.0, backward=0.0, optimizer=0.5,
                    decoder_optimizer=0.25)
    assert busy_step(t, 4) == 12.75
    assert ideal_step_time([t], 4, False, allreduce_s=0.1) == pytest.approx(12.0 + 0.5 + 0.1
                                                                              + 0.25)


def test_balanced_pipeline_pays_the_fill_bubble_once() -> None:
    """H = 1, W equal workers: the last worker starts (W-1) forwards late, then never waits:
    (W-1) f + M (f + b)."""
    f, b, W, M = 1.0, 3.0, 3, 5
    ws = [WorkerTimes(f, b)] * W
    assert simulate(ws, M, False, 0.0) == [pytest.approx((W - 1) * f + M * (f + b))]


def test_the_slowest_worker_sets_the_pace() -> None:
    fast, slow = WorkerTimes(1.0, 1.0), WorkerTimes(1.0, 4.0)
    # worker 1 (slow) starts at 1 and then works 5 per micro-batch back to back
    assert simulate([fast, slow], 3, False, 0.0)[0] == pytest.approx(1.0 + 3 * 5.0)


def test_backward_phase_drains_through_every_worker() -> None:
    """H > 1, two workers, one micro-batch: worker 0 forward (1) -> worker 1 forward and
    readout (1 + 1) -> worker 1 backward (2) -> worker 0 backward (3)."""
    w0 = WorkerTimes(pre_send=1.0, post_send=0.5, backward=3.0)
    w1 = WorkerTimes(pre_send=1.0, post_send=1.0, backward=2.0)
    assert simulate([w0, w1], 1, True, 0.0)[0] == pytest.approx(1 + 1 + 1 + 2 + 3)


def test_stale_consensus_removes_the_bubble_between_steps() -> None:
    ws = [WorkerTimes(1.0, 2.0, optimizer=0.2, decoder_optimizer=0.1)] * 2
    lockstep = ideal_step_time(ws, 4, False, allreduce_s=0.3)
    stale = ideal_step_time(ws, 4, False, allreduce_s=0.3, staleness=1)
    bound = max(busy_step(w, 4) for w in ws)
    assert lockstep == pytest.approx(1.0 + 4 * 3.0 + 0.2 + 0.3 + 0.1)
    assert bound - 1e-9 <= stale < lockstep
    assert stale == pytest.approx(bound)   # steady state: the slowest worker never waits


def test_oversubscribed_threads_stretch_the_compute() -> None:
    ws = [WorkerTimes(1.0, 1.0)] * 2
    base = ideal_step_time(ws, 2, False, 0.0, threads=2, cores=2)
    assert ideal_step_time(ws, 2, False, 0.0, threads=4, cores=2) == pytest.approx(2 * base)
    with pytest.raises(ParameterError):
        simulate([], 2, False, 0.0)


def test_the_speedup_factors_multiply_to_the_measured_ratio() -> None:
    from lmrepro.rgc.analysis.schedule import decompose

    f = decompose(backprop_step_s=0.227, backprop_cores=24 / 29 * 2, async_step_s=0.183,
                  ideal_step_s=0.167, busy_core_s=0.31, async_cores=2.0)
    assert f.speedup == pytest.approx(0.227 / 0.183, rel=1e-12)
    assert f.core_ratio == pytest.approx(29 / 24)
    # a perfectly balanced, bubble-free schedule uses every core: utilisation 1
    g = decompose(1.0, 2.0, 0.5, 0.5, 1.0, 2.0)
    assert (g.utilisation, g.executor_efficiency, g.work_efficiency) == (1.0, 1.0, 2.0)


def test_decompose_refuses_a_non_positive_time() -> None:
    from lmrepro.errors import ParameterError
    from lmrepro.rgc.analysis.schedule import decompose

    with pytest.raises(ParameterError, match="ideal_step_s"):
        decompose(1.0, 2.0, 0.5, 0.0, 1.0, 2.0)


def test_running_ahead_removes_the_backward_drain() -> None:
    """H > 1: in lockstep one micro-batch crosses both workers forward (1 + 1) and back
    (2 + 2) every step; running ahead (s = 1) worker 0 backpropagates the gradient worker 1
    sent a step earlier, so neither waits and the step is one worker's work (1 + 2). With four
    workers and four micro-batches the bubble goes too: the step is the busy time 4 x 3."""
    two = [WorkerTimes(pre_send=1.0, post_send=0.0, backward=2.0)] * 2
    assert ideal_step_time(two, 1, True, allreduce_s=0.0) == pytest.approx(6.0)
    assert ideal_step_time(two, 1, True, allreduce_s=0.0, staleness=1) == pytest.approx(3.0)
    four = [WorkerTimes(pre_send=1.0, post_send=0.0, backward=2.0)] * 4
    lockstep = ideal_step_time(four, 4, True, allreduce_s=0.0)
    ahead = ideal_step_time(four, 4, True, allreduce_s=0.0, staleness=1)
    assert ahead == pytest.approx(busy_step(four[0], 4)) and lockstep > 1.5 * ahead
