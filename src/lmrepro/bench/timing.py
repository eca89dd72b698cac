"""Wall-clock timing helpers for the benchmarks (``time.perf_counter``)."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def summarize(times_s: Sequence[float]) -> dict[str, float]:
    """Median, mean, min, max, standard deviation and count of repeated timings (seconds)."""
    if not times_s:
        raise ValueError("no timings to summarise")
    xs = [float(x) for x in times_s]
    return {"median_s": statistics.median(xs), "mean_s": statistics.fmean(xs),
            "min_s": min(xs), "max_s": max(xs),
            "stdev_s": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def time_repeats(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


class PhaseTimer:
    """Accumulates wall time per named phase; wrap callables with :meth:`wrap` or time blocks
    with :meth:`phase`. ``totals`` and ``counts`` are reset by :meth:`reset`."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.enabled = True

    def reset(self) -> None:
        self.totals.clear()
        self.counts.clear()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] += time.perf_counter() - t0
            self.counts[name] += 1

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed under ``name`` on every call (same arguments and result)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def per_call(self, steps: int) -> dict[str, float]:
        """Mean seconds per step of each phase over ``steps`` steps."""
        return {k: v / max(1, steps) for k, v in self.totals.items()}
