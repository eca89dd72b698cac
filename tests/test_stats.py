"""Tests of the paired bootstrap non-inferiority test (DESIGN.md, "Non-inferiority")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmrepro.errors import ParameterError
from lmrepro.stats import NonInferiorityResult, noninferiority, relative_differences

N_RES = 2000


def pairs(true_diff: float, n: int = 200, noise: float = 0.005, seed: int = 1
          ) -> tuple[np.ndarray, np.ndarray]:
    """Per-batch baseline losses and candidate losses ``true_diff`` worse, with relative noise."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.0, 2.0, n)
    cand = base * (1.0 + true_diff + rng.normal(0.0, noise, n))
    return base, cand


def numpy_percentile_upper(d: np.ndarray, n_resamples: int, seed: int, confidence: float
                           ) -> tuple[float, np.ndarray]:
    """A direct percentile bootstrap of mean(d): resample pair indices with the same generator
    scipy is handed, take the ``confidence`` quantile of the resampled means."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, (n_resamples, d.size))
    means = d[idx].mean(axis=1)
    return float(np.quantile(means, confidence)), means


@pytest.mark.parametrize("true_diff, expected", [(0.0, True), (-0.01, True), (0.03, False),
                                                 (0.012, False)])
def test_verdict_on_both_sides_of_the_margin(true_diff: float, expected: bool) -> None:
    base, cand = pairs(true_diff)
    res = noninferiority(base, cand, margin=0.01, n_resamples=N_RES, seed=0)
    assert res.non_inferior is expected
    assert res.non_inferior == (res.upper_bound < res.margin)
    assert res.mean_rel_diff == pytest.approx(true_diff, abs=0.002)
    assert res.n_pairs == 200
    assert res.upper_bound > res.mean_rel_diff


def test_mean_below_margin_but_bound_above_fails() -> None:
    """The RGC enwik8 shape: mean d under 1 % but the upper bound over it -> not non-inferior."""
    base, cand = pairs(0.0084, n=60, noise=0.03, seed=3)
    res = noninferiority(base, cand, n_resamples=N_RES)
    assert res.mean_rel_diff < 0.01 < res.upper_bound
    assert not res.non_inferior
    assert res.verdict == "not non-inferior"


def test_percentile_bound_equals_a_direct_numpy_bootstrap() -> None:
    base, cand = pairs(0.004, n=50, noise=0.01)
    res = noninferiority(base, cand, n_resamples=N_RES, seed=7, method="percentile")
    d = (cand - base) / base
    upper, means = numpy_percentile_upper(d, N_RES, seed=7, confidence=0.95)
    assert res.method == "percentile"
    assert res.upper_bound == pytest.approx(upper, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(np.sort(res.bootstrap_distribution), np.sort(means), rtol=1e-12)
    assert res.mean_rel_diff == pytest.approx(d.mean(), rel=1e-12)


def test_bca_bound_close_to_percentile_and_normal_theory() -> None:
    """On near-symmetric data BCa differs from the percentile bound by Monte Carlo/skew noise only,
    and both sit near the normal-theory bound mean + z_0.95 * sd / sqrt(n)."""
    base, cand = pairs(0.002, n=400, noise=0.01, seed=11)
    d = (cand - base) / base
    res = noninferiority(base, cand, n_resamples=5000, seed=0)
    assert res.method == "BCa" and res.fallback_reason is None
    upper_np, _ = numpy_percentile_upper(d, 5000, seed=3, confidence=0.95)
    se = d.std(ddof=1) / math.sqrt(d.size)
    assert abs(res.upper_bound - upper_np) < 0.15 * se
    assert res.upper_bound == pytest.approx(d.mean() + 1.6449 * se, abs=0.15 * se)
    assert res.standard_error == pytest.approx(se, rel=0.1)


def test_one_sided_bound_is_the_confidence_quantile() -> None:
    """A higher confidence gives a higher one-sided upper bound (alternative='less')."""
    base, cand = pairs(0.0, n=80, noise=0.01)
    lo = noninferiority(base, cand, confidence=0.8, n_resamples=N_RES, method="percentile")
    hi = noninferiority(base, cand, confidence=0.99, n_resamples=N_RES, method="percentile")
    assert lo.upper_bound < hi.upper_bound
    assert hi.upper_bound == pytest.approx(np.quantile(hi.bootstrap_distribution, 0.99))


def test_deterministic_under_the_seed() -> None:
    base, cand = pairs(0.005, n=40, noise=0.02)
    a = noninferiority(base, cand, n_resamples=N_RES, seed=5)
    b = noninferiority(base, cand, n_resamples=N_RES, seed=5)
    c = noninferiority(base, cand, n_resamples=N_RES, seed=6)
    assert a.upper_bound == b.upper_bound
    np.testing.assert_array_equal(a.bootstrap_distribution, b.bootstrap_distribution)
    assert not np.array_equal(a.bootstrap_distribution, c.bootstrap_distribution)


def test_defaults_follow_the_design() -> None:
    base, cand = pairs(0.0, n=30)
    res = noninferiority(base, cand)
    assert isinstance(res, NonInferiorityResult)
    assert (res.margin, res.confidence, res.n_resamples, res.seed) == (0.01, 0.95, 10_000, 0)
    assert res.method == "BCa"
    assert res.bootstrap_distribution.shape == (10_000,)
    with pytest.raises(AttributeError):
        res.upper_bound = 0.0  # frozen


def test_same_in_nats_and_bits_per_byte() -> None:
    base, cand = pairs(0.006, n=50, noise=0.01)
    nats = noninferiority(base, cand, n_resamples=N_RES)
    bits = noninferiority(base / math.log(2), cand / math.log(2), n_resamples=N_RES)
    assert bits.mean_rel_diff == pytest.approx(nats.mean_rel_diff, rel=1e-9)
    assert bits.upper_bound == pytest.approx(nats.upper_bound, rel=1e-9)
    assert bits.non_inferior == nats.non_inferior


@pytest.mark.parametrize("cand_value, expected", [(2.01, True), (2.04, False)])
def test_bca_falls_back_to_percentile_when_degenerate(cand_value: float, expected: bool) -> None:
    base = np.full(20, 2.0)
    cand = np.full(20, cand_value)
    res = noninferiority(base, cand, n_resamples=N_RES)
    d = cand_value / 2.0 - 1.0
    assert res.method == "percentile"
    assert "identical" in res.fallback_reason
    assert res.upper_bound == pytest.approx(d, rel=1e-12)
    assert res.non_inferior is expected


def test_relative_differences_are_per_pair() -> None:
    d = relative_differences([1.0, 2.0, 4.0], [1.1, 1.0, 4.0])
    np.testing.assert_allclose(d, [0.1, -0.5, 0.0])


@pytest.mark.parametrize("base, cand, name, fragment", [
    ([1.0, 2.0, 3.0], [1.0, 2.0], "candidate", "paired"),
    ([], [], "baseline", "empty"),
    ([1.0], [1.0], "baseline", "at least 2"),
    ([1.0, 2.0, 3.0, float("nan")], [1.0, 2.0, 3.0, 4.0], "baseline[3]", "finite"),
    ([1.0, 0.0, 3.0], [1.0, 2.0, 3.0], "baseline[1]", "> 0"),
    ([1.0, -2.0, 3.0], [1.0, 2.0, 3.0], "baseline[1]", "> 0"),
    ([1.0, 2.0, 3.0], [1.0, float("inf"), 3.0], "candidate[1]", "finite"),
    ([1.0, 2.0, 3.0], [1.0, 2.0, -3.0], "candidate[2]", ">= 0"),
    ([[1.0, 2.0], [1.0, 2.0]], [[1.0, 2.0], [1.0, 2.0]], "baseline", "1-D"),
])
def test_rejects_bad_losses(base, cand, name: str, fragment: str) -> None:
    with pytest.raises(ParameterError) as info:
        noninferiority(base, cand, n_resamples=N_RES)
    assert info.value.name == name
    assert fragment in str(info.value)


@pytest.mark.parametrize("kwargs, name", [
    ({"margin": 0.0}, "margin"), ({"margin": 1.0}, "margin"), ({"margin": -0.01}, "margin"),
    ({"confidence": 0.5}, "confidence"), ({"confidence": 1.0}, "confidence"),
    ({"n_resamples": 99}, "n_resamples"), ({"n_resamples": 500.5}, "n_resamples"),
    ({"seed": -1}, "seed"), ({"method": "basic"}, "method"),
])
def test_rejects_bad_options(kwargs: dict, name: str) -> None:
    base, cand = pairs(0.0, n=10)
    with pytest.raises(ParameterError) as info:
        noninferiority(base, cand, **kwargs)
    assert info.value.name == name
    assert repr(kwargs[name]) in str(info.value)
