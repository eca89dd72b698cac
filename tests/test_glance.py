"""Our figure in brief, as the index's claims table shows it (the rest goes to its note)."""

from __future__ import annotations

import pytest

from lmrepro.pipeline import claims, glance
from lmrepro.pipeline.glance import brief


@pytest.mark.parametrize("measured, short", [
    ("mean d +4.68 %, L +4.26 %, U +5.1 % (seed level; batch-level U +4.88 %, sign-flip p 1; "
     "margin 1.0%): worse; test split, 3 seeds, 369 pairs; baseline 3.595 bits/byte",
     "mean d +4.68 %, L +4.26 %, U +5.1 %: worse"),
    ("0.928x per step (scape@99% p=2 vs adams p=2; run-level 95 % interval 0.844x to 1.02x)",
     "0.928x per step"),
    ("top-k @ 99%: 0 of 3 runs diverged, 0 loss spikes (dense AdamS: 0 diverged, 0 spikes); "
     "quality: mean d +8.24 %", "top-k @ 99%: 0 of 3 runs diverged, 0 loss spikes"),
    ("predicted weak-scaling efficiency from 8 GPUs (Llama-500M, 200 Gbit/s): 32 GPUs dense "
     "98.8% / SCAPE 100.0%", "predicted weak-scaling efficiency from 8 GPUs: 32 GPUs dense "
     "98.8% / SCAPE 100.0%"),
    ("not run in this profile", "not run in this profile"),
    ("measured in the authors' logs: 1.58x per step (1.55-1.61x from the IQRs). Our model "
     "fitted to them gives 2.63-3.62x", "measured in the authors' logs: 1.58x per step. Our "
     "model fitted to them gives 2.63-3.62x"),
    ("mean d +5.62 %, L +4.23 %, U +7 % (seed level; margin 1.0%): worse; steps to target: >= "
     "1.45x [0.66, 3.17] dense AdamS's steps for the same loss (3 seeds); test split, 3 seeds",
     "mean d +5.62 %, L +4.23 %, U +7 %: worse; steps to target: >= 1.45x [0.66, 3.17] dense "
     "AdamS's steps for the same loss"),
    ("this run 1.17x tokens/s (9039 vs 7732; same core budget: 2 threads each; run-level 95 % "
     "interval 0.476x to 2.87x over 2 seeds); pooled over 4 sessions (8 seeds) on AMD EPYC, 2 "
     "cores: 1.11x [0.94, 1.3] (session-level 95 % t interval)",
     "this run 1.17x tokens/s; pooled over 4 sessions on AMD EPYC, 2 cores: 1.11x [0.94, 1.3]"),
])
def test_our_figure_in_brief_keeps_the_numbers_and_drops_the_details(measured: str,
                                                                     short: str) -> None:
    assert brief(measured) == short


def test_every_verdict_has_a_meaning_in_the_registrys_order() -> None:
    assert list(glance.VERDICT_MEANINGS) == list(claims.VERDICTS)
    assert glance.CAVEAT_SEPARATOR == claims.CAVEAT_SEPARATOR
    assert glance.STEPS_TO_TARGET == claims.STEPS_TO_TARGET
    assert glance.POOLED == claims.POOLED


def test_every_verdict_cell_has_the_class_the_reports_style() -> None:
    """The index's claims table and legend name a verdict's cell as the other tables do
    (:func:`lmrepro.pipeline.tables.table_html`): letters and digits only, so an apostrophe
    (the authors' logs) leaves no class the stylesheet cannot match."""
    from lmrepro.pipeline.report import _CSS

    for verdict in claims.VERDICTS:
        name = glance._verdict_class(verdict)
        assert name.replace("-", "").isalnum(), name
    assert f"td.{glance._verdict_class(claims.CONSISTENT_WITH_LOGS)}{{" in _CSS
