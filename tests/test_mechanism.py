"""SCAPE's mechanism contrasts read as sentences (lmrepro.scape.mechanism): each says no more
than its one-sided bounds."""

from __future__ import annotations

import math

import pytest

from lmrepro.scape.mechanism import direction, sentence


def _row(mean: float, lower: float, upper: float, **kw) -> dict:
    return {"candidate": "cand", "baseline": "base", "isolates": "one thing", "seeds": 3,
            "diverged": 0, "mean": mean, "lower": lower, "upper": upper, **kw}


@pytest.mark.parametrize("lower, upper, expected", [
    (-0.03, -0.01, "better"), (0.01, 0.02, "worse"), (-0.01, 0.02, "no difference detected"),
    (math.nan, 0.02, "untested"),
])
def test_direction_needs_both_bounds_on_one_side(lower, upper, expected) -> None:
    assert direction(_row(0.0, lower, upper)) == expected
    assert direction(_row(0.0, lower, upper, diverged=1)) == "diverged"


def test_a_sentence_claims_the_gap_closed_only_for_a_difference() -> None:
    better = sentence(_row(-0.02, -0.03, -0.01, gap_closed=0.4))
    assert "better: it closes 40 % of base's gap to dense AdamS" in better
    assert "[L -3.00 %, U -1.00 %]" in better and "3 seeds" in better
    worse = sentence(_row(0.02, 0.01, 0.03, gap_closed=-0.5))
    assert "worse: it widens base's gap to dense AdamS by 50 %" in worse
    tie = sentence(_row(0.005, -0.01, 0.02, gap_closed=0.9))
    assert "no difference detected" in tie and "closes" not in tie
    assert "larger than 2.0 % either way is ruled out" in tie
    # a baseline with no gap to close (gap_closed None) gets the direction alone
    assert sentence(_row(-0.02, -0.03, -0.01, gap_closed=None)).endswith("better.")
