"""Shared fixtures. Tests run on 2 CPU cores: keep torch to one thread and models tiny."""

from __future__ import annotations

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def text_bytes() -> np.ndarray:
    """A small, learnable byte stream (repeated English with some variety)."""
    words = b"the quick brown fox jumps over the lazy dog and then sleeps under a tree. "
    rng = np.random.default_rng(0)
    parts = [words[i:] + words[:i] for i in rng.integers(0, len(words), size=1200)]
    return np.frombuffer(b"".join(parts), dtype=np.uint8).copy()


def pytest_configure(config: pytest.Config) -> None:
    """The tests run the pipeline as the ``lmrepro`` command does: with the wings installed."""
    from lmrepro.pipeline.registry import install
    from lmrepro.wings import WINGS

    install(WINGS)
