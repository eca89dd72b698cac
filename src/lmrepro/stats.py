"""Paired non-inferiority test on per-batch evaluation losses (DESIGN.md, "Non-inferiority").

The design's reference test, as implemented here:

* **Pairs.** ``baseline[i]`` and ``candidate[i]`` are the mean losses of two models on the *same*
  evaluation batch ``i`` (and, where several seeds were run, the same seed: callers concatenate the
  per-seed lists in the same order). Lower is better.
* **Statistic.** The per-pair relative difference ``d_i = (candidate_i - baseline_i) / baseline_i``
  and its **mean** ``mean(d)``; we bootstrap the mean of the per-pair ``d`` (not the ratio of mean
  losses), which is what the design calls "the mean relative difference, paired". Because bits per
  byte is ``loss_nats / ln 2``, ``d`` is the same whether the losses are in nats or in bits.
* **Bootstrap.** :func:`scipy.stats.bootstrap` over the pairs (resampling pair indices, so the
  pairing is kept), ``n_resamples`` resamples (10 000 by default), ``rng =
  numpy.random.default_rng(seed)``, **one-sided**: ``alternative="less"`` at ``confidence_level =
  confidence`` gives the interval ``(-inf, U]`` whose upper end ``U`` is the one-sided upper
  confidence bound of the mean relative difference (for the percentile method, ``U`` is the
  ``confidence`` quantile of the bootstrap distribution, linear interpolation).
* **Method.** BCa by default (second-order accurate, corrects bias and skew). BCa is undefined when
  the bootstrap distribution is degenerate (e.g. every ``d_i`` identical: the acceleration is 0/0);
  then the percentile interval of the *same* bootstrap distribution is used, and the result's
  ``method`` says ``"percentile"`` and ``fallback_reason`` says why.
* **Verdict.** Non-inferior iff ``U < margin`` (margin 0.01 = 1 % by default).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field
from scipy import stats as sps

from lmrepro.config import Section
from lmrepro.errors import ParameterError, check

METHODS = ("BCa", "percentile")


class StatsConfig(Section):
    """The ``stats:`` section: the non-inferiority test's settings (DESIGN.md)."""

    key = "stats"

    margin: float = Field(default=0.01, gt=0.0, lt=1.0, description="non-inferiority margin on "
                          "the mean relative difference (0.01 = 1 %)")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="one-sided confidence "
                              "of the upper bound")
    n_resamples: int = Field(default=10000, ge=100, description="bootstrap resamples")
    seed: int = Field(default=0, ge=0, description="bootstrap seed")

# Above this many resampled values (n_resamples * n_pairs) the bootstrap runs in batches so the
# resample index matrix stays small (the batches draw from the same rng, one after another).
_BATCH_ELEMENTS = 1 << 24
# Relative spread of d below which the pairs count as identical (float rounding of c/b - 1).
_IDENTICAL_TOL = 1e-12


@dataclass(frozen=True)
class NonInferiorityResult:
    """Outcome of :func:`noninferiority`.

    ``mean_rel_diff`` and ``upper_bound`` are fractions (0.01 = 1 % worse than the baseline).
    ``bootstrap_distribution`` holds the mean relative difference of each resample (for plots).
    """

    mean_rel_diff: float
    upper_bound: float
    margin: float
    non_inferior: bool
    n_pairs: int
    method: str
    confidence: float
    n_resamples: int
    seed: int
    bootstrap_distribution: np.ndarray = field(repr=False, compare=False)
    standard_error: float = float("nan")
    fallback_reason: str | None = None

    @property
    def verdict(self) -> str:
        """``"non-inferior"`` or ``"not non-inferior"`` (human-readable)."""
        return "non-inferior" if self.non_inferior else "not non-inferior"


def relative_differences(baseline: Sequence[float] | np.ndarray,
                         candidate: Sequence[float] | np.ndarray) -> np.ndarray:
    """Per-pair ``(candidate - baseline) / baseline`` after validating the pairs.

    Raises :class:`~lmrepro.errors.ParameterError` for unpaired, empty, too short (< 2 pairs),
    non-finite, non-positive-baseline or negative-candidate input.
    """
    b = _as_losses(baseline, "baseline")
    c = _as_losses(candidate, "candidate")
    check(b.shape == c.shape, "candidate", f"<{c.size} losses>",
          f"must be paired with baseline: the same number of per-batch losses ({b.size})")
    check(b.size >= 2, "baseline", f"<{b.size} losses>",
          "needs at least 2 paired per-batch losses to bootstrap")
    _check_values(b, "baseline", positive=True)
    _check_values(c, "candidate", positive=False)
    return (c - b) / b


def noninferiority(baseline: Sequence[float] | np.ndarray,
                   candidate: Sequence[float] | np.ndarray,
                   margin: float = 0.01, confidence: float = 0.95, n_resamples: int = 10_000,
                   seed: int = 0, *, method: str = "BCa") -> NonInferiorityResult:
    """Paired bootstrap non-inferiority test of ``candidate`` against ``baseline`` (lower loss is
    better), DESIGN.md "Non-inferiority".

    Args:
        baseline: per-batch losses of the reference model (all finite and > 0).
        candidate: per-batch losses of the model under test on the same batches (finite, >= 0).
        margin: non-inferiority margin on the mean relative difference, in (0, 1).
        confidence: one-sided confidence level of the upper bound, in (0.5, 1).
        n_resamples: bootstrap resamples, >= 100.
        seed: seed of ``numpy.random.default_rng`` handed to scipy (results are deterministic).
        method: ``"BCa"`` (default; falls back to percentile when degenerate) or ``"percentile"``.

    Returns:
        :class:`NonInferiorityResult`; ``non_inferior`` is ``upper_bound < margin``.
    """
    d = relative_differences(baseline, candidate)
    _check_options(margin, confidence, n_resamples, seed, method)
    mean_d = float(np.mean(d))

    res, used, reason = _bootstrap_upper(d, confidence, n_resamples, seed, method)
    upper = float(res.confidence_interval.high)
    return NonInferiorityResult(
        mean_rel_diff=mean_d, upper_bound=upper, margin=float(margin),
        non_inferior=bool(upper < margin), n_pairs=int(d.size), method=used,
        confidence=float(confidence), n_resamples=int(n_resamples), seed=int(seed),
        bootstrap_distribution=np.asarray(res.bootstrap_distribution, dtype=float),
        standard_error=float(res.standard_error), fallback_reason=reason,
    )


def _bootstrap_upper(d: np.ndarray, confidence: float, n_resamples: int, seed: int, method: str
                     ) -> tuple[Any, str, str | None]:
    """One-sided (``alternative="less"``) bootstrap of ``mean(d)``; BCa -> percentile fallback.

    Returns scipy's ``BootstrapResult``, the method used and the fallback reason (or None).

    The fallback reuses the BCa run's bootstrap distribution (``bootstrap_result=``,
    ``n_resamples=0``), so it is the percentile interval of exactly the same resamples.
    """
    batch = None
    if n_resamples * d.size > _BATCH_ELEMENTS:
        batch = max(1, _BATCH_ELEMENTS // d.size)
    common = dict(statistic=np.mean, confidence_level=confidence, alternative="less",
                  vectorized=True, axis=-1)
    if method == "percentile":
        res = sps.bootstrap((d,), n_resamples=n_resamples, batch=batch, method="percentile",
                            rng=np.random.default_rng(seed), **common)
        return res, "percentile", None

    reason = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = sps.bootstrap((d,), n_resamples=n_resamples, batch=batch, method="BCa",
                            rng=np.random.default_rng(seed), **common)
    if float(np.ptp(d)) <= _IDENTICAL_TOL * max(1.0, float(np.max(np.abs(d)))):
        reason = ("all per-pair relative differences are identical (to rounding): the BCa "
                  "acceleration is 0/0")
    elif not math.isfinite(float(res.confidence_interval.high)):
        msgs = "; ".join(str(w.message) for w in caught) or "non-finite BCa bound"
        reason = f"BCa interval undefined ({msgs})"
    if reason is None:
        for w in caught:  # a usable BCa interval: pass scipy's warnings on unchanged
            warnings.warn(w.message, w.category, stacklevel=3)
        return res, "BCa", None
    res = sps.bootstrap((d,), n_resamples=0, method="percentile", bootstrap_result=res,
                        rng=np.random.default_rng(seed), **common)
    return res, "percentile", reason


def _as_losses(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ParameterError(name, x, "must be a 1-D sequence of per-batch losses") from exc
    check(arr.ndim == 1, name, f"<array of shape {arr.shape}>",
          "must be a 1-D sequence of per-batch losses")
    check(arr.size > 0, name, "<0 losses>", "must not be empty: pass the per-batch eval losses")
    return arr


def _check_values(arr: np.ndarray, name: str, *, positive: bool) -> None:
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ParameterError(f"{name}[{i}]", float(arr[i]), "every loss must be finite")
    bad = arr <= 0 if positive else arr < 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        allowed = ("must be > 0 (the relative difference divides by the baseline loss)"
                   if positive else "must be >= 0 (a cross-entropy loss)")
        raise ParameterError(f"{name}[{i}]", float(arr[i]), allowed)


def _check_options(margin: float, confidence: float, n_resamples: int, seed: int, method: str
                   ) -> None:
    check(isinstance(margin, (int, float)) and 0.0 < margin < 1.0, "margin", margin,
          "must be a fraction in (0, 1), e.g. 0.01 for a 1 % margin")
    check(isinstance(confidence, (int, float)) and 0.5 < confidence < 1.0, "confidence",
          confidence, "must be in (0.5, 1), e.g. 0.95 for a one-sided 95 % bound")
    check(isinstance(n_resamples, (int, np.integer)) and not isinstance(n_resamples, bool)
          and n_resamples >= 100, "n_resamples", n_resamples, "must be an integer >= 100")
    check(isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0,
          "seed", seed, "must be an integer >= 0")
    check(method in METHODS, "method", method, f"must be one of {list(METHODS)}")
