"""The evaluation set: the whole validation split in non-overlapping windows (or a stated,
evenly spaced part of it), the same for every method and seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmrepro.errors import ParameterError
from lmrepro.evaluation import (TrainingConfig, eval_coverage, eval_window_starts,
                                evaluate_losses)
from lmrepro.model import lm_loss


def test_whole_split_windows_cover_every_target_byte_once() -> None:
    n, context, batch = 1000, 16, 4
    starts = eval_window_starts(n, context, batch)
    # 999 // 16 = 62 windows, 15 full batches of 4 (2 windows of an incomplete batch left out)
    assert starts.shape == (15, 4)
    flat = starts.ravel()
    assert (np.diff(flat) == context).all() and flat[0] == 0
    targets = np.concatenate([np.arange(s + 1, s + context + 1) for s in flat])
    assert len(set(targets.tolist())) == targets.size == 60 * context   # no byte twice
    assert targets.max() < n
    assert eval_coverage(n, context, batch) == pytest.approx(60 * 16 / 999)


def test_a_number_of_batches_is_an_evenly_spaced_stated_part() -> None:
    starts = eval_window_starts(1000, 16, 4, n_batches=3)
    assert starts.shape == (3, 4)
    flat = starts.ravel()
    assert flat[0] == 0 and flat[-1] == 61 * 16          # first and last window of the split
    assert (np.diff(flat) >= 16).all()                    # distinct, non-overlapping
    assert (flat % 16 == 0).all()
    assert eval_coverage(1000, 16, 4, 3) == pytest.approx(12 * 16 / 999)
    # a split of exactly 15 full batches: asking for all 15 is the default set
    np.testing.assert_array_equal(eval_window_starts(961, 16, 4, 15),
                                  eval_window_starts(961, 16, 4))
    assert eval_coverage(961, 16, 4) == 1.0


@pytest.mark.parametrize("kwargs, name", [({"n_batches": 16}, "eval_batches"),
                                          ({"n_batches": 0}, "eval_batches"),
                                          ({"batch_size": 63}, "eval_batch_size")])
def test_an_evaluation_set_larger_than_the_split_is_refused(kwargs: dict, name: str) -> None:
    args = {"n_bytes": 1000, "context": 16, "batch_size": 4, **kwargs}
    with pytest.raises(ParameterError) as info:
        eval_window_starts(**args)
    assert info.value.name == name and "validation" in str(info.value)


def test_losses_are_per_batch_and_paired() -> None:
    data = np.random.default_rng(0).integers(0, 256, 700).astype(np.uint8)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(256, 256)

    def logits(x: torch.Tensor) -> torch.Tensor:
        return emb(x)

    losses = evaluate_losses(logits, data, 8, 5)
    starts = eval_window_starts(700, 8, 5)
    assert len(losses) == len(starts) == 699 // 8 // 5
    x = torch.from_numpy(np.stack([data[s:s + 8] for s in starts[2]]).astype(np.int64))
    y = torch.from_numpy(np.stack([data[s + 1:s + 9] for s in starts[2]]).astype(np.int64))
    with torch.no_grad():
        assert losses[2] == pytest.approx(float(lm_loss(logits(x), y)))
    assert evaluate_losses(logits, data, 8, 5) == losses       # the same set every call


def test_the_default_is_the_whole_split() -> None:
    assert TrainingConfig().eval_batches is None
    assert TrainingConfig(eval_batches=8).eval_batches == 8
    with pytest.raises(ParameterError):
        TrainingConfig(eval_batches=0)
