"""The bytes an RGC run trains on when given none (:func:`synthetic_corpus`) and the check of
the bytes it is given (:func:`check_data`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lmrepro.errors import check


def synthetic_corpus(n_bytes: int = 200_000, seed: int = 0) -> np.ndarray:
    """Deterministic text-like bytes (words from a small vocabulary) for runs given no data."""
    rng = np.random.default_rng(seed)
    words = [w.encode() for w in (
        "the of and to in is was for on that with as by at from his her it an were are which "
        "this be or has had not but first one their its new after who they have two river "
        "stone garden winter morning letter music light").split()]
    out = bytearray()
    while len(out) < n_bytes:
        sentence = b" ".join(words[i] for i in rng.integers(0, len(words), rng.integers(4, 14)))
        out += sentence[:1].upper() + sentence[1:] + b". "
    return np.frombuffer(bytes(out[:n_bytes]), dtype=np.uint8).copy()


def check_data(name: str, data: Any, context: int) -> np.ndarray:
    check(isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1, name,
          type(data).__name__ if not isinstance(data, np.ndarray) else f"array {data.dtype}"
          f"{list(data.shape)}", "must be a 1-D numpy uint8 array of bytes")
    check(len(data) > context + 1, name, f"{len(data)} bytes",
          f"must hold more than context + 1 = {context + 1} bytes")
    return data
