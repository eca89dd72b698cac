"""SCAPE's mechanism contrasts read as sentences (lmrepro.scape.study.mechanism): each says no more
than its one-sided bounds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lmrepro.scape.study.mechanism import direction, sentence


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


ROOT = Path(__file__).resolve().parents[1]
PUB = ROOT / "published" / "mechanism"


def test_the_published_contrasts_recompute_from_the_published_runs() -> None:
    """Every row of published/mechanism's contrast table follows from its per-run files."""
    import json

    import pandas as pd

    from lmrepro.pipeline.params import load_params
    from lmrepro.scape.study.mechanism import contrast_table
    from lmrepro.scape.study.report import study_runs
    from lmrepro.stats import StatsConfig

    stats = StatsConfig(**json.loads((PUB / "results" / "params.json").read_text())["stats"])
    study = load_params(ROOT / "params.yaml", "mechanism").scape.scaling
    runs = study_runs(PUB / "results" / "scaling")
    got = contrast_table(runs, study.contrasts, study.verdict_size, study.verdict_steps, stats)
    want = pd.read_csv(PUB / "results" / "analysis" / "scaling" / "contrasts.csv")
    assert list(got.candidate) == list(want.candidate) and len(got) == 7
    for col in ("mean", "lower", "upper", "candidate_gap_to_adams", "gap_closed"):
        assert got[col].astype(float).tolist() == pytest.approx(want[col].tolist(),
                                                                  rel=1e-9, nan_ok=True), col


def test_the_docs_section_is_generated_from_the_published_study() -> None:
    """docs/scape.md's mechanism section is what lmrepro publish --pages-only
    writes from published/mechanism (and the runs it shares with published/scaling)."""
    from lmrepro.scape.study.mechanism_review import BEGIN, END, section

    doc = (ROOT / "docs" / "scape.md").read_text(encoding="utf-8")
    in_doc = BEGIN + doc.split(BEGIN, 1)[1].split(END, 1)[0] + END
    got = section(PUB, ROOT / "published" / "scaling")
    got = got.replace(PUB.as_posix(), "published/mechanism").replace(
        (ROOT / "published" / "scaling").as_posix(), "published/scaling")
    assert got == in_doc
    assert "| topk90 | scape90 |" in in_doc and "| adams | 0 |" in in_doc


def test_no_claim_speaks_for_a_variant_of_its_method() -> None:
    """The verdict point's records (what the claims read) leave out the runs that set a
    mechanism knob; the mechanism profile has 9 runs there, 4 of them variants."""
    import json

    from lmrepro.pipeline.params import load_params
    from lmrepro.scape.study.mechanism import variants
    from lmrepro.scape.study.report import study_runs, verdict_records
    from lmrepro.stats import StatsConfig

    study = load_params(ROOT / "params.yaml", "mechanism").scape.scaling
    assert variants(study) == ["scape90_dense", "scape90_keepm", "scape99_keepm",
                               "topk99_zerom"]
    assert variants(load_params(ROOT / "params.yaml", "scaling").scape.scaling) == []
    runs = study_runs(PUB / "results" / "scaling")
    stats = StatsConfig(**json.loads((PUB / "results" / "params.json").read_text())["stats"])
    named = json.dumps(verdict_records(runs, "2x64", 3000, stats, {}, variants(study))
                       .model_dump(mode="json"))
    assert "keepm" not in named and "zerom" not in named and "_dense" not in named
    assert "topk90" in named and "scape90" in named
