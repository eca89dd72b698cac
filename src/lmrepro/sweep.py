"""The winner of a learning-rate sweep and the check of a winner on the grid's edge, one rule for
every suite and study."""

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


def sweep_lr(lr: float, factor: float) -> float:
    """A sweep value: ``lr * factor`` to 3 significant digits (what its run's name shows)."""
    return float(f"{lr * factor:.3g}")


def _grid(rows: Sequence[dict[str, Any]], run: str) -> list[float]:
    return sorted(float(r["lr"]) for r in rows if r["run"] == run)


def on_edge(rows: Sequence[dict[str, Any]], best: dict[str, float]) -> list[str]:
    """The runs whose winner is the smallest or the largest value of their grid (the optimum
    may lie beyond it), sorted."""
    return sorted(run for run, lr in best.items()
                  if math.isclose(lr, _grid(rows, run)[0])
                  or math.isclose(lr, _grid(rows, run)[-1]))


def beyond_edge(rows: Sequence[dict[str, Any]], best: dict[str, float], run: str) -> float:
    """One grid step (the grid's ratio) beyond ``run``'s winner on the grid's edge, to 3
    significant digits: what an edge check trains."""
    lrs = _grid(rows, run)
    lr, ratio = best[run], lrs[1] / lrs[0]
    return float(f"{lr * ratio:.3g}" if lr >= lrs[-1] else f"{lr / ratio:.3g}")


def edge_row(rows: Sequence[dict[str, Any]], best: dict[str, float], run: str,
             beyond_lr: float, final_bpb: float | None, diverged_at_step: int | None
             ) -> dict[str, Any]:
    """One row of an edge check: ``run``'s winner and its validation bits/byte beside the run
    one grid step beyond it, and whether that one is better."""
    grid_bpb = next(r["final_bpb"] for r in rows if r["run"] == run and r["lr"] == best[run])
    return {"run": run, "grid_lr": best[run], "grid_bpb": grid_bpb, "beyond_lr": beyond_lr,
            "beyond_final_bpb": final_bpb, "beyond_diverged_at_step": diverged_at_step,
            "beyond_is_better": final_bpb is not None and final_bpb < grid_bpb}
