"""The winner of a learning-rate sweep, one rule for every suite and study."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def select_best(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per ``row["run"]``, the ``lr`` of the lowest finite ``final_bpb`` (ties: the smaller lr);
    a run whose every value diverged is left out."""
    best: dict[str, tuple[float, float]] = {}
    for r in rows:
        bpb = r["final_bpb"]
        if bpb is None or not math.isfinite(bpb):
            continue
        key = (float(bpb), float(r["lr"]))
        if r["run"] not in best or key < best[r["run"]]:
            best[r["run"]] = key
    return {run: lr for run, (_, lr) in best.items()}
