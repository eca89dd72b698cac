"""Paired non-inferiority test on per-batch evaluation losses (docs/statistics.md).

The design's reference test, as implemented here (``docs/statistics.md`` states it with its
references and reasons):

* **Pairs.** ``baseline[i]`` and ``candidate[i]`` are the mean losses of two models on the *same*
  evaluation batch ``i`` and, where several training seeds were run, the same seed: pairs are keyed
  by (seed, evaluation batch), and ``groups[i]`` names the seed of pair ``i``. Lower is better.
* **Statistic.** The per-pair relative difference ``d_i = (candidate_i - baseline_i) / baseline_i``
  and its **mean** over all pairs ``mean(d)``; we bootstrap the mean of the per-pair ``d`` (not
  the ratio of mean losses), which is what the design calls "the mean relative difference,
  paired". Because bits per byte is ``loss_nats / ln 2``, ``d`` is the same in nats and in bits.
* **Batch-level bound.** :func:`scipy.stats.bootstrap` over the pairs (resampling pair indices, so
  the pairing is kept), ``n_resamples`` resamples (10 000 by default), ``rng =
  numpy.random.default_rng(seed)``, **one-sided**: ``alternative="less"`` at ``confidence_level =
  confidence`` gives the interval ``(-inf, U]`` whose upper end ``U`` is the one-sided upper
  confidence bound of the mean relative difference. BCa by default (second-order accurate,
  corrects bias and skew); BCa is undefined when the bootstrap distribution is degenerate (e.g.
  every ``d_i`` identical: the acceleration is 0/0), then the percentile interval of the *same*
  bootstrap distribution is used, and ``method`` says ``"percentile"`` and ``fallback_reason``
  why. This bound sees evaluation-batch noise only.
* **Crossed batches.** Every seed is scored on the same evaluation batches (seeds and batches are
  crossed, not nested), so the batch-level bootstrap resamples batch indices jointly for all seeds:
  it bootstraps the per-batch mean of ``d`` over the seeds (the statistic is linear, so this is
  the same mean). It is a secondary figure: it sees evaluation-batch noise only.
* **Seed-level bound** (the verdict's, with ``groups`` naming at least ``min_groups`` seeds; the
  seed is the experimental unit). Per seed the mean of its ``d``; across the ``G`` seed means a
  one-sided Student t interval, ``mean +- t_{confidence, G-1} * sd / sqrt(G)``, gives the upper
  bound ``U`` and the lower bound ``L``; an exact sign-flip permutation test on the seed means
  gives ``p_value`` for non-inferiority (H0: mean >= margin; the ``2^G`` sign patterns of
  ``seed mean - margin``) and ``p_value_worse`` (H0: mean <= 0). With ``G`` seeds the smallest
  p-value is ``2^-G``, so ``G >= 5`` is needed to reach 0.05. A percentile bootstrap over 3 seeds
  has 10 distinct resamples and cannot reach past the worst seed: too narrow, not used.
* **Verdict.** Non-inferior iff ``U < margin`` (margin 0.01 = 1 % by default); worse iff
  ``L > 0``. ``U`` and ``L`` are the seed-level bounds when there are at least ``min_groups``
  seeds, else the batch-level ones; ``level`` says which, and both levels are reported.
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
#: how the seed-level bounds are computed (reported beside the batch-level ``method``)
SEED_METHOD = "one-sided Student t on the per-seed means (df = seeds - 1)"
#: the fewest seeds whose seed-level bound decides the verdict
MIN_GROUPS = 3
LEVELS = ("batch", "seed")


class StatsConfig(Section):
    """The ``stats:`` section: the non-inferiority test's settings (docs/statistics.md)."""

    key = "stats"

    margin: float = Field(default=0.01, gt=0.0, lt=1.0, description="non-inferiority margin on "
                          "the mean relative difference (0.01 = 1 %)")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="one-sided confidence "
                              "of the upper bound")
    n_resamples: int = Field(default=10000, ge=100, description="bootstrap resamples")
    seed: int = Field(default=0, ge=0, description="bootstrap seed")
    min_seeds: int = Field(default=MIN_GROUPS, ge=2, description="training seeds from which the "
                           "verdict is taken from the seed-level (hierarchical) bound instead of "
                           "the batch-level one")

# Above this many resampled values (n_resamples * n_pairs) the bootstrap runs in batches so the
# resample index matrix stays small (the batches draw from the same rng, one after another).
_BATCH_ELEMENTS = 1 << 24
# Relative spread of d below which the pairs count as identical (float rounding of c/b - 1).
_IDENTICAL_TOL = 1e-12


@dataclass(frozen=True)
class NonInferiorityResult:
    """Outcome of :func:`noninferiority`.

    ``mean_rel_diff`` and the bounds are fractions (0.01 = 1 % worse than the baseline).
    ``upper_bound`` is the bound the verdict uses: ``seed_upper_bound`` when ``level`` is
    ``"seed"``, else ``batch_upper_bound``. ``method`` is the batch-level bootstrap's method
    (BCa or percentile); the seed-level bound is always :data:`SEED_METHOD`.
    ``bootstrap_distribution`` holds the resampled means behind ``upper_bound`` (for plots);
    ``batch_distribution`` and ``seed_distribution`` those of each level.
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
    level: str = "batch"
    batch_upper_bound: float = float("nan")
    seed_upper_bound: float | None = None
    n_groups: int = 1
    group_means: tuple[float, ...] = ()
    min_groups: int = MIN_GROUPS
    lower_bound: float = float("nan")
    batch_lower_bound: float = float("nan")
    seed_lower_bound: float | None = None
    p_value: float | None = None          # sign-flip, H0: mean >= margin (seed level)
    p_value_worse: float | None = None    # sign-flip, H0: mean <= 0 (seed level)

    @property
    def worse(self) -> bool:
        """The candidate is worse than the baseline: the lower bound is above 0."""
        return bool(self.lower_bound > 0.0)

    @property
    def verdict(self) -> str:
        """``"non-inferior"``, ``"worse"`` (lower bound above 0 and not non-inferior),
        ``"non-inferior (but worse)"`` or ``"not non-inferior"`` (neither shown)."""
        if self.non_inferior:
            return "non-inferior (but worse)" if self.worse else "non-inferior"
        return "worse" if self.worse else "not non-inferior"


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
                   seed: int = 0, *, method: str = "BCa",
                   groups: Sequence[Any] | np.ndarray | None = None,
                   min_groups: int = MIN_GROUPS) -> NonInferiorityResult:
    """Paired bootstrap non-inferiority test of ``candidate`` against ``baseline`` (lower loss is
    better), docs/statistics.md.

    Args:
        baseline: per-batch losses of the reference model (all finite and > 0).
        candidate: per-batch losses of the model under test on the same batches (finite, >= 0).
        margin: non-inferiority margin on the mean relative difference, in (0, 1).
        confidence: one-sided confidence level of the upper bound, in (0.5, 1).
        n_resamples: bootstrap resamples, >= 100.
        seed: seed of ``numpy.random.default_rng`` (results are deterministic).
        method: batch-level method, ``"BCa"`` (default; falls back to percentile when
            degenerate) or ``"percentile"``.
        groups: the training seed of each pair (any labels, one per pair); None: one seed.
            With two or more distinct labels the seed-level bound is computed too.
        min_groups: seeds from which the verdict uses the seed-level bound (>= 2; default 3).

    Returns:
        :class:`NonInferiorityResult`; ``non_inferior`` is ``upper_bound < margin``.
    """
    d = relative_differences(baseline, candidate)
    _check_options(margin, confidence, n_resamples, seed, method)
    check(isinstance(min_groups, (int, np.integer)) and not isinstance(min_groups, bool)
          and min_groups >= 2, "min_groups", min_groups, "must be an integer >= 2")
    codes = _group_codes(groups, d.size)
    mean_d = float(np.mean(d))
    n_groups = int(codes.max()) + 1
    group_means = tuple(float(d[codes == g].mean()) for g in range(n_groups))

    res, used, reason = _bootstrap_upper(crossed_batch_means(d, codes), confidence,
                                         n_resamples, seed, method)
    batch_upper = float(res.confidence_interval.high)
    batch_dist = np.asarray(res.bootstrap_distribution, dtype=float)
    batch_lower = float(np.quantile(batch_dist, 1.0 - confidence))
    seed_lo = seed_hi = p_ni = p_worse = None
    if n_groups >= 2:
        seed_lo, seed_hi = t_bounds(group_means, confidence)
        p_ni = sign_flip_p(np.asarray(group_means) - margin, "less")
        p_worse = sign_flip_p(np.asarray(group_means), "greater")
    level = "seed" if seed_hi is not None and n_groups >= min_groups else "batch"
    upper = seed_hi if level == "seed" and seed_hi is not None else batch_upper
    lower = seed_lo if level == "seed" and seed_lo is not None else batch_lower
    return NonInferiorityResult(
        mean_rel_diff=mean_d, upper_bound=upper, margin=float(margin),
        non_inferior=bool(upper < margin), n_pairs=int(d.size), method=used,
        confidence=float(confidence), n_resamples=int(n_resamples), seed=int(seed),
        bootstrap_distribution=batch_dist, standard_error=float(res.standard_error),
        fallback_reason=reason, level=level, batch_upper_bound=batch_upper,
        seed_upper_bound=seed_hi, n_groups=n_groups, group_means=group_means,
        min_groups=int(min_groups), lower_bound=lower, batch_lower_bound=batch_lower,
        seed_lower_bound=seed_lo, p_value=p_ni, p_value_worse=p_worse,
    )


def t_bounds(means: Sequence[float], confidence: float) -> tuple[float, float]:
    """One-sided ``confidence`` lower and upper Student t bounds of the mean of ``means`` (the
    per-seed means; df = ``len(means) - 1``). Identical means give the mean itself."""
    x = np.asarray(means, dtype=float)
    check(x.size >= 2, "means", f"<{x.size} values>", "needs at least 2 seeds")
    half = float(sps.t.ppf(confidence, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return float(x.mean()) - half, float(x.mean()) + half


def sign_flip_p(x: Sequence[float] | np.ndarray, alternative: str) -> float:
    """Exact sign-flip permutation p-value of the mean of ``x`` (symmetric about 0 under H0):
    over all ``2^n`` sign patterns, the fraction whose mean is at most (``"less"``) or at least
    (``"greater"``) the observed one (Fisher 1935; Good 2005, ch. 3). The smallest is ``2^-n``."""
    x = np.asarray(x, dtype=float)
    check(1 <= x.size <= 20, "x", f"<{x.size} values>", "must hold 1..20 values (2^n patterns)")
    check(alternative in ("less", "greater"), "alternative", alternative,
          "must be 'less' or 'greater'")
    signs = 1 - 2 * ((np.arange(2 ** x.size)[:, None] >> np.arange(x.size)) & 1)
    means = (signs * np.abs(x)).mean(axis=1)
    obs, tol = float(x.mean()), 1e-12 * max(1.0, float(np.abs(x).max()))
    hits = means <= obs + tol if alternative == "less" else means >= obs - tol
    return float(hits.mean())


def crossed_batch_means(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Per evaluation batch, the mean of ``d`` over the seeds, when every seed has the same
    batches in the same order (crossed: the pairs of each seed are consecutive in batch order);
    else ``d`` itself (one seed, or unequal seeds). Bootstrapping these resamples batches jointly
    across seeds."""
    n_groups = int(codes.max()) + 1
    sizes = np.bincount(codes, minlength=n_groups)
    if n_groups == 1 or len(set(sizes.tolist())) != 1:
        return d
    return np.stack([d[codes == g] for g in range(n_groups)]).mean(axis=0)


def _group_codes(groups: Sequence[Any] | np.ndarray | None, n: int) -> np.ndarray:
    """Codes ``0..G-1`` of the groups in sorted label order (all 0 without groups)."""
    if groups is None:
        return np.zeros(n, dtype=np.int64)
    labels = list(groups)
    check(len(labels) == n, "groups", f"<{len(labels)} labels>",
          f"must name the seed of each of the {n} pairs")
    try:
        _, codes = np.unique(np.asarray(labels), return_inverse=True)
    except TypeError as exc:
        raise ParameterError("groups", labels[:5], "must be sortable labels (e.g. the seeds)") \
            from exc
    return codes.astype(np.int64).ravel()


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
