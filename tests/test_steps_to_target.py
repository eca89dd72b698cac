"""Steps to target (lmrepro.pipeline.steps_to_target) and the warmup-stable-decay schedule."""

import math

import numpy as np
import pytest

from lmrepro.evaluation import cosine_lr, decay_start, wsd_lr
from lmrepro.harness import Cadence, Schedule
from lmrepro.pipeline.steps_to_target import (crossing, end_multiplier, log_interval,
                                              multiplier_rows, multiplier_table, targets_between)

STEPS = [100, 200, 400, 800, 1600, 3200, 6400]


def power_law(steps, scale=1.0, a=8.0, b=0.25):
    """A loss curve a * (s / scale) ** -b: the same curve needing `scale` times the steps."""
    return [a * (s / scale) ** -b for s in steps]


def test_crossing_interpolates_in_log_steps():
    # a curve linear in log(steps) is recovered exactly between the evaluations
    steps = [100, 1000]
    losses = [4.0, 3.0]
    assert crossing(steps, losses, 3.5) == pytest.approx(math.sqrt(100 * 1000))
    assert crossing(steps, losses, 4.5) == 100.0          # reached at the first evaluation
    assert crossing(steps, losses, 2.9) is None           # never reached


def test_crossing_takes_the_first_crossing():
    assert crossing([1, 2, 4, 8], [5.0, 3.0, 3.5, 2.0], 3.2) < 2.0


def test_a_curve_needing_twice_the_steps_has_multiplier_two():
    base = {s: (STEPS, power_law(STEPS)) for s in range(3)}
    cand = {s: (STEPS, power_law(STEPS, scale=2.0)) for s in range(3)}
    rows = multiplier_rows(base, cand, [2.0, 1.5, 1.2])
    assert [r["multiplier"] for r in rows] == pytest.approx([2.0] * 3, rel=0.02)
    assert all(r["censored"] == 0 and r["seeds"] == 3 for r in rows)


def test_the_interval_is_a_t_interval_on_per_seed_log_multipliers():
    logs = [math.log(1.5), math.log(2.0), math.log(3.0)]
    mean, low, high = log_interval(logs)
    x = np.array(logs)
    half = 4.302652729911275 * x.std(ddof=1) / math.sqrt(3)     # t(0.975, df=2)
    assert mean == pytest.approx(math.exp(x.mean()))
    assert (low, high) == pytest.approx((math.exp(x.mean() - half), math.exp(x.mean() + half)))


def test_a_candidate_that_never_reaches_the_target_is_censored_to_a_lower_bound():
    base = {0: (STEPS, power_law(STEPS)), 1: (STEPS, power_law(STEPS))}
    cand = {0: (STEPS, power_law(STEPS, scale=100.0)), 1: (STEPS, power_law(STEPS, scale=100.0))}
    target = power_law([1600])[0]
    (row,) = multiplier_rows(base, cand, [target])
    assert row["censored"] == 2
    assert row["multiplier"] == pytest.approx(6400 / 1600, rel=1e-6)   # last step / baseline's
    assert math.isnan(row["lower"]) and math.isnan(row["upper"])      # a bound: no interval


def test_end_multiplier_is_the_baseline_steps_to_the_candidates_final_loss():
    base = {s: (STEPS, power_law(STEPS)) for s in range(3)}
    cand = {s: (STEPS, power_law(STEPS, scale=2.0)) for s in range(3)}
    got = end_multiplier(base, cand)
    assert got["multiplier"] == pytest.approx(2.0, rel=1e-6)
    assert got["censored"] == 0


def test_the_table_spans_the_floor_to_the_baselines_final_loss():
    longer = [*STEPS, 12800]
    curves = {"dense": {s: (STEPS, power_law(STEPS)) for s in range(2)},
              "sparse": {s: (longer, power_law(longer, scale=1.5)) for s in range(2)}}
    floor = 2.0
    table = multiplier_table(curves, "dense", floor, n_targets=5)
    assert list(table.candidate.unique()) == ["sparse"]
    assert table.target.max() == pytest.approx(floor)
    assert table.target.min() == pytest.approx(power_law(STEPS)[-1])
    assert table.multiplier.to_numpy() == pytest.approx([1.5] * 5, rel=0.03)
    assert (table.censored == 0).all()
    assert targets_between(3.0, 3.5) == []     # a baseline above the floor: no target


def test_wsd_is_constant_until_its_decay_whatever_the_length():
    for step in range(0, 900):
        assert wsd_lr(step, 1000, 50, 1.0, 0.1, 0.1) == wsd_lr(step, 4000, 50, 1.0, 0.1, 0.1)
    assert wsd_lr(899, 1000, 50, 1.0, 0.1, 0.1) == 1.0
    assert wsd_lr(999, 1000, 50, 1.0, 0.1, 0.1) == pytest.approx(0.1)
    assert decay_start(1000, 0.1) == 900
    assert 0.1 < wsd_lr(950, 1000, 50, 1.0, 0.1, 0.1) < 1.0
    # cosine, by contrast, depends on the run's length at every step after the warm-up
    assert cosine_lr(500, 1000, 50, 1.0) != cosine_lr(500, 4000, 50, 1.0)


def test_the_harness_schedule_follows_the_declared_kind():
    wsd = Schedule(1000, 10, 2.0, 0.1, "wsd", 0.2)
    cos = Schedule(1000, 10, 2.0, 0.1)
    assert wsd(500) == 2.0 and wsd(999) == pytest.approx(0.2)
    assert cos(500) == pytest.approx(cosine_lr(500, 1000, 10, 2.0, 0.1))


def test_the_cadence_evaluates_at_the_listed_step_counts_before_the_last():
    c = Cadence(100, eval_at=frozenset({10, 30, 100}))
    assert [d for d in range(1, 101) if c.eval_due(d)] == [10, 30]


def test_lack_of_fit_rejects_a_line_through_curved_means_and_keeps_a_straight_one():
    from lmrepro.pipeline.length_study import lack_of_fit

    rng = np.random.default_rng(0)
    x = np.repeat([1.0, 2.0, 3.0, 4.0], 5)
    noise = rng.normal(0, 0.01, x.size)
    for y, rejected in ((0.1 * x + noise, False), (0.1 * (x - 2.5) ** 2 + noise, True)):
        fit = np.polyfit(x, y, 1)
        f, p = lack_of_fit(x, y, np.polyval(fit, x))
        assert (p < 0.05) == rejected, (f, p)


def test_the_published_length_trend_fails_its_lack_of_fit_test_and_is_not_extrapolated():
    """The training-length study published from the scaling profile: its log-linear trends
    are rejected (2x64 SCAPE 90 % against AdamS: F = 199, p = 6e-7), so none is extrapolated."""
    import json
    from pathlib import Path

    import pandas as pd

    from lmrepro.pipeline.length_study import trend

    root = Path(__file__).resolve().parents[1]
    d = json.loads((root / "published/scaling/results/analysis/scaling/scaling.json").read_text())
    t = trend(pd.DataFrame(d["gaps"]), to_steps=100_000)
    row = t[(t["size"] == "2x64") & (t.candidate == "scape90") & (t.baseline == "adams")].iloc[0]
    assert row.lack_of_fit_F == pytest.approx(199.24, rel=1e-3)
    assert row.lack_of_fit_p < 1e-6
    assert not t.extrapolated.any() and t.get("extrapolated_gap_at") is None


def test_the_docs_review_of_the_published_study_is_what_the_code_computes():
    """docs/scape.md's scaling-review section is regenerated from published/scaling by today's
    analysis (lmrepro publish --pages-only writes it: review.doc_sections)."""
    import json
    from pathlib import Path

    from lmrepro.scape.study.review import BEGIN, END, section
    from lmrepro.stats import StatsConfig

    root = Path(__file__).resolve().parents[1]
    pub = root / "published" / "scaling"
    stats = StatsConfig(**json.loads((pub / "results" / "params.json").read_text())["stats"])
    doc = (root / "docs" / "scape.md").read_text(encoding="utf-8")
    in_doc = BEGIN + doc.split(BEGIN, 1)[1].split(END, 1)[0] + END
    got = section(pub, stats).replace(pub.as_posix(), "published/scaling")
    assert got == in_doc
    assert "| 2x64 | 3000 | topk99 (47) | scape90 (98) |" in in_doc


def test_a_final_loss_is_placed_on_the_baselines_constant_lr_curve_as_a_lower_bound():
    from lmrepro.pipeline.steps_to_target import final_loss_multiplier

    base = {s: (STEPS, power_law(STEPS)) for s in range(3)}
    # each candidate ends (after 6400 steps) where the baseline's curve is at 1600 steps
    finals = {s: (6400, power_law([1600])[0]) for s in range(3)}
    got = final_loss_multiplier(base, finals)
    assert got["multiplier"] == pytest.approx(4.0, rel=1e-6) and got["unreached"] == 0
    # below everything the baseline's curve reaches: no multiplier from that seed
    finals[2] = (6400, 0.1)
    got = final_loss_multiplier(base, finals)
    assert got["seeds"] == 2 and got["unreached"] == 1


def test_the_claims_show_the_final_loss_multiplier_beside_the_gap():
    """The 12 000-step study's SCAPE-vs-AdamS records carry their steps-to-target multiplier
    into the claims' measured text (issue 27, item 5); other baselines carry none."""
    from pathlib import Path

    import pandas as pd

    from lmrepro.pipeline.claims import ni_text
    from lmrepro.pipeline.records import AnalysisRecords
    from lmrepro.scape.study.report import with_multipliers

    pub = Path(__file__).resolve().parents[1] / "published" / "horizon" / "results" / \
        "analysis" / "scaling"
    records = AnalysisRecords.model_validate_json((pub / "analysis.json").read_text())
    ends = pd.read_csv(pub / "final_multiplier.csv")
    got = with_multipliers(records, ends)
    seen = 0
    for c in got.comparisons:
        name = c.candidate_runs[0].rsplit("/", 1)[-1]
        row = ends[ends.candidate == name]
        if c.baseline_method != "adams" or row.empty:
            assert c.steps_to_target is None
            continue
        r = row.iloc[0]
        want = "not measurable" if r.seeds == 0 else f">= {r.multiplier:.2f}x"
        assert c.steps_to_target.startswith(want)
        assert f"steps to target: {want}" in ni_text(c)
        seen += 1
    assert seen >= 2


# -- the multiplier at equal final loss (decay branches) -----------------------------------------
def _final_curve(lengths, shift):
    """A final-loss curve log-linear in steps: loss 2.0 at 100 * shift steps, 0.1 less per
    doubling; a method needing ``shift`` times the steps of shift 1."""
    return (lengths, [2.0 - 0.1 * math.log2(n / (100 * shift)) for n in lengths])


def test_equal_final_loss_multiplier_from_known_curves():
    from scipy import stats as sps

    from lmrepro.pipeline.steps_to_target import equal_final_loss_rows, steps_at_final_loss

    base_len = [100, 200, 400, 800]
    shifts = {0: 1.8, 1: 2.0, 2: 2.3}
    base = {s: _final_curve(base_len, 1.0) for s in shifts}
    cand = {s: _final_curve([200, 400, 1000, 3000], k) for s, k in shifts.items()}
    rows = equal_final_loss_rows(base, cand)
    assert [r["candidate_steps"] for r in rows] == [200, 400, 1000, 3000]
    # a length n is inside AdamS's curve (100 to 800 steps) iff 100 k <= n <= 800 k
    by_n = {r["candidate_steps"]: r for r in rows}
    for n in (400, 1000):
        r = by_n[n]
        assert r["measured"] and r["outside"] == 0
        assert r["per_seed"] == pytest.approx([shifts[s] for s in sorted(shifts)], rel=1e-9)
        logs = [math.log(k) for k in shifts.values()]
        half = sps.t.ppf(0.975, 2) * np.std(logs, ddof=1) / math.sqrt(3)
        assert r["multiplier"] == pytest.approx(math.exp(np.mean(logs)), rel=1e-9)
        assert r["lower"] == pytest.approx(math.exp(np.mean(logs) - half), rel=1e-9)
        assert r["upper"] == pytest.approx(math.exp(np.mean(logs) + half), rel=1e-9)
    # 200 steps with k = 2.3 end above 2.0, AdamS's shortest run: that length is not measured
    assert by_n[200]["outside"] == 1 and by_n[200]["measured"] is False
    assert math.isnan(by_n[200]["multiplier"]) and len(by_n[200]["per_seed"]) == 2
    # 3000 steps: a loss below every final loss of AdamS's curve: not measured, no multiplier
    assert by_n[3000]["outside"] == 3 and math.isnan(by_n[3000]["multiplier"])
    assert steps_at_final_loss(base_len, base[0][1], 2.01) is None
    assert steps_at_final_loss(base_len, base[0][1], 1.65) is None
    assert steps_at_final_loss(base_len, base[0][1], 1.85) == pytest.approx(
        100 * 2 ** 1.5, rel=1e-9)


def test_equal_final_loss_needs_the_same_lengths_in_every_seed():
    from lmrepro.pipeline.steps_to_target import equal_final_loss_rows

    base = {0: _final_curve([100, 200], 1.0), 1: _final_curve([100, 200], 1.0)}
    cand = {0: _final_curve([100, 200], 1.0), 1: _final_curve([100, 300], 1.0)}
    with pytest.raises(ValueError, match="same lengths"):
        equal_final_loss_rows(base, cand)
