"""The alpha-beta (latency-bandwidth) model of communication and the ideal step time it implies.

A collective handing ``n`` bytes per rank to the network takes ``t(n) = alpha + beta * n``:
``alpha`` the fixed latency (seconds), ``beta`` the seconds per byte (``1 / beta`` the effective
bandwidth of that collective on that link, which already includes how many times the algorithm
sends each byte and, on a shared loopback, both directions drawing from one token bucket).
``alpha`` and ``beta`` are fitted by least squares to a sweep of message sizes measured on the very
link the training runs on.

The ideal step time of a method is its compute time measured without communication plus the
predicted time of each blocking collective it issues; a collective started asynchronously and
waited for only in the next step (SCAPE's mask all-gather) is hidden behind up to
``overlap_window_s`` of compute and only its excess counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted line ``t(n) = alpha_s + beta_s_per_byte * n``.

    Attributes:
        alpha_s: latency in seconds (intercept).
        beta_s_per_byte: seconds per byte (slope).
        r2: coefficient of determination of the fit on the measured points.
        max_rel_err: largest ``|pred - t| / t`` over the measured points.
        n_points: number of (size, time) points fitted.
    """

    alpha_s: float
    beta_s_per_byte: float
    r2: float = float("nan")
    max_rel_err: float = float("nan")
    n_points: int = 0

    def predict(self, nbytes: float) -> float:
        """Predicted seconds for a message of ``nbytes`` bytes (0 bytes: no call, 0 s)."""
        if nbytes <= 0:
            return 0.0
        return self.alpha_s + self.beta_s_per_byte * float(nbytes)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return math.inf if self.beta_s_per_byte <= 0 else 1.0 / self.beta_s_per_byte

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bandwidth_MB_per_s"] = self.bandwidth_bytes_per_s / 1e6
        return d


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float],
                   relative: bool = True) -> AlphaBeta:
    """Least-squares fit of ``t = alpha + beta * n``.

    Args:
        sizes_bytes: message sizes ``n`` (at least two distinct values).
        times_s: measured times, one per size (repeat a size to give it more weight).
        relative: minimise relative errors (each row weighted by ``1 / t``), so the microsecond
            latencies of small messages are not swamped by the seconds of large ones; ``False``
            is ordinary least squares.

    Returns:
        :class:`AlphaBeta` with ``alpha`` and ``beta`` clipped at 0 (negative values are fitting
        noise: the slope is then refitted through the origin, or the line made flat).
    """
    n = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(times_s, dtype=np.float64)
    if n.shape != t.shape or n.ndim != 1:
        raise ValueError("sizes_bytes and times_s must be 1-D and of equal length")
    if len(np.unique(n)) < 2:
        raise ValueError("need at least two distinct message sizes to fit alpha and beta")
    if np.any(t <= 0) and relative:
        raise ValueError("times must be > 0 for a relative fit")
    w = 1.0 / t if relative else np.ones_like(t)
    a = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    if alpha < 0:  # refit the slope through the origin
        alpha = 0.0
        beta = float(np.sum(w * w * n * t) / np.sum(w * w * n * n))
    if beta < 0:   # times fall with size: noise only; a flat line (latency, no bandwidth term)
        beta = 0.0
        alpha = float(np.sum(w * w * t) / np.sum(w * w))
    pred = alpha + beta * n
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    max_rel = float(np.max(np.abs(pred - t) / t)) if np.all(t > 0) else float("nan")
    return AlphaBeta(float(alpha), float(beta), r2, max_rel, int(len(n)))


def comm_time(models: Mapping[str, AlphaBeta], calls: Iterable[tuple[str, float]]) -> float:
    """Predicted seconds of a sequence of blocking collectives ``[(kind, bytes per rank), ...]``,
    each kind priced by its own fitted model."""
    total = 0.0
    for kind, nbytes in calls:
        if kind not in models:
            raise KeyError(f"no alpha-beta model for collective {kind!r}; have {sorted(models)}")
        total += models[kind].predict(nbytes)
    return total


def ideal_step_time(compute_s: float, blocking_comm_s: float, async_comm_s: float = 0.0,
                    overlap_window_s: float = 0.0) -> float:
    """``compute + blocking communication + max(0, async communication - overlap window)``.

    ``compute_s`` is the step measured with communication removed; ``async_comm_s`` the time of
    collectives that may run under ``overlap_window_s`` seconds of that compute.
    """
    if min(compute_s, blocking_comm_s, async_comm_s, overlap_window_s) < 0:
        raise ValueError("times must be >= 0")
    return compute_s + blocking_comm_s + max(0.0, async_comm_s - overlap_window_s)


def speedup(baseline_s: float, candidate_s: float) -> float:
    """``baseline / candidate``: how many times faster the candidate's step is."""
    if baseline_s <= 0 or candidate_s <= 0:
        raise ValueError("step times must be > 0")
    return baseline_s / candidate_s


def fraction_of_ideal(measured_speedup: float, ideal_speedup: float) -> float:
    """Measured speedup as a fraction of the model's ideal one (1.0: the limit is reached).

    With ideal speedup ``S*`` and measured ``S``, the fraction is ``S / S*``.
    """
    if ideal_speedup <= 0:
        raise ValueError("ideal speedup must be > 0")
    return measured_speedup / ideal_speedup


def optimal_link_bytes(kind: str, nbytes: float, world: int) -> float:
    """Bytes a bandwidth-optimal (ring) algorithm puts on a link shared by all ranks (one
    loopback token bucket carries every rank's traffic), for ``nbytes`` handed in per rank:

    * all-reduce: each rank sends ``2 (p-1)/p * n``, in all ``2 (p-1) n``;
    * reduce-scatter (``n`` = the full input per rank): each sends ``(p-1)/p * n``, in all
      ``(p-1) n``;
    * all-gather (``n`` = each rank's part): each sends ``(p-1) n``, in all ``p (p-1) n``.

    Priced with the ping-pong fit (one message crossing the link alone), this gives the limit of
    the link itself, independent of how a library implements the collective.
    """
    if world < 1 or nbytes < 0:
        raise ValueError("world must be >= 1 and nbytes >= 0")
    p = world
    if kind == "all_reduce":
        return 2.0 * (p - 1) * nbytes
    if kind == "reduce_scatter":
        return float(p - 1) * nbytes
    if kind == "all_gather":
        return float(p * (p - 1)) * nbytes
    raise KeyError(f"unknown collective {kind!r}")


def link_limit_comm_time(link: AlphaBeta, calls: Iterable[tuple[str, float]], world: int
                         ) -> float:
    """Seconds of ``[(kind, bytes per rank), ...]`` at the link's own latency and bandwidth
    (``link`` fitted on a ping-pong), with bandwidth-optimal algorithms."""
    total = 0.0
    for kind, nbytes in calls:
        if nbytes > 0:
            total += link.alpha_s + link.beta_s_per_byte * optimal_link_bytes(kind, nbytes,
                                                                               world)
    return total
