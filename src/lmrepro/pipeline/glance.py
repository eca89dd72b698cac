"""The index's "Results at a glance": the claims table a reader takes in at once.

One short row per claim and setting (the claim, the paper's figure, ours in brief, the verdict,
a note number); everything else the claims table holds (our figure in full, both scales, the
caveats) goes to the numbered notes below it, and a legend says what each verdict present
means (:data:`VERDICT_MEANINGS`). It imports nothing of the claims registry (the report stage
reads the claims table, not the wings): the verdicts and the caveat separator are
:mod:`lmrepro.pipeline.claims`'s, which a test checks.
"""

from __future__ import annotations

import html
import re
from typing import Any

#: what each verdict (:data:`lmrepro.pipeline.claims.VERDICTS`, in its order) means
VERDICT_MEANINGS = {
    "reproduced": ("our figure agrees with the paper's within the tolerance its rule states; "
                   "a figure with an interval: the interval holds the paper's figure"),
    "reproduced in direction only": ("the same direction as the paper's figure, outside that "
                                     "tolerance"),
    "same direction, larger than the paper's": ("our figure's interval lies above the paper's "
                                                "figure, on its side of no effect (e.g. a "
                                                "larger gap than the paper's)"),
    "same direction, smaller than the paper's": ("our figure's interval lies below the paper's "
                                                 "figure, on its side of no effect"),
    "consistent with the authors' logs": ("the authors' own logs measure the claim's direction "
                                          "across their spread (between allocations)"),
    "not reproduced": "our figure contradicts the paper's",
    "inconclusive": ("the measurement cannot decide (e.g. a timing difference inside its "
                     "spread)"),
    "not testable at this scale": ("a quality verdict whose dense baseline did not end 10 % "
                                   "below the corpus's trigram floor: the models have not "
                                   "learned what the claim is about"),
    "not testable here": ("no experiment of this package can test the claim, or this "
                          "profile lacks what its test needs, e.g. runs long enough to be "
                          "timed (the note says which)"),
    "not measured in the authors' logs": ("no log of the authors measures the paper's figure; "
                                          "only our model fitted to the logs extrapolates to "
                                          "it (its figure and validated error in the note)"),
    "not run": "this profile does not run what would measure it",
}
#: how the claims table joins a row's caveats (:data:`lmrepro.pipeline.claims.CAVEAT_SEPARATOR`)
CAVEAT_SEPARATOR = "; "
#: how a measured text introduces a steps-to-target multiplier (pipeline.claims.STEPS_TO_TARGET)
STEPS_TO_TARGET = "steps to target:"
#: how a measured text introduces a timing pooled over sessions (pipeline.claims.POOLED)
POOLED = "pooled over"

#: how long our figure may be in the table before its parenthetical details move to the note
BRIEF_CHARS = 90


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _without_parentheses(text: str) -> str:
    """``text`` less every parenthesised group (nested ones included)."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return re.sub(r"\s+([:,;.])", r"\1", re.sub(r"\s{2,}", " ", "".join(out))).strip()


def brief(measured: str) -> str:
    """Our figure in brief: without its parenthesised details, up to its first ``;``
    (``mean d +4.68 %, L +4.26 %, U +5.1 % (seed level; ...): worse; test split, ...`` ->
    ``mean d +4.68 %, L +4.26 %, U +5.1 %: worse``), and a steps-to-target multiplier where the
    figure has one, and the pooled figure a timing verdict rests on."""
    text = str(measured or "")
    parts = _without_parentheses(text).split("; ")
    short = parts[0]
    # a length study's steps-to-target multiplier stays beside the gap, and a timing pooled
    # over sessions beside this run's (the verdict is the pooled figure's)
    short += "".join(f"; {p}" for p in parts[1:] if p.startswith((STEPS_TO_TARGET, POOLED)))
    return short if short else text[:BRIEF_CHARS]


def _verdict_class(verdict: str) -> str:
    return "verdict-" + "-".join(re.findall(r"[a-z0-9]+", str(verdict).lower()))


def legend_html(verdicts: list[str]) -> str:
    """What each of ``verdicts`` means, in the registry's order, with its colour."""
    shown = [v for v in VERDICT_MEANINGS if v in set(verdicts)]
    rows = "".join(f"<tr><td class=\"txt {_verdict_class(v)}\">{_e(v)}</td>"
                   f"<td>{_e(VERDICT_MEANINGS[v])}</td>"
                   f"<td class=\"num\">{verdicts.count(v)}</td></tr>" for v in shown)
    return ("<div class=\"lmrepro-table legend\"><table><caption>What the verdicts mean"
            "</caption><thead><tr><th>verdict</th><th>meaning</th><th>rows</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")


def _note(row: Any) -> str:
    parts = [f"<b>Ours</b>: {_e(row['measured'])}"]
    if str(row.get("our_scale") or ""):
        parts.append(f"<b>our scale</b>: {_e(row['our_scale'])}")
    parts.append(f"<b>paper's scale</b>: {_e(row['paper_scale'])}")
    caveats = [c for c in str(row.get("caveats") or "").split(CAVEAT_SEPARATOR) if c]
    if caveats:
        parts.append("<b>caveats</b>: " + "; ".join(_e(c) for c in caveats))
    return ". ".join(parts) + "."


def claims_html(claims: Any) -> str:
    """The short claims table, the verdict legend and the numbered notes (``claims``: a
    DataFrame of :data:`lmrepro.pipeline.claims.CLAIM_COLUMNS`)."""
    rows, notes = [], []
    for i, (_, row) in enumerate(claims.iterrows(), start=1):
        rows.append(
            f"<tr><td class=\"txt\">{_e(row['claim'])}</td>"
            f"<td class=\"txt\">{_e(row['paper_figure'])}</td>"
            f"<td class=\"txt\">{_e(brief(row['measured']))}</td>"
            f"<td class=\"txt {_verdict_class(row['verdict'])}\">{_e(row['verdict'])}</td>"
            f"<td class=\"num\"><a href=\"#note-{i}\">{i}</a></td></tr>")
        notes.append(f"<li id=\"note-{i}\">{_note(row)}</li>")
    table = ("<div class=\"lmrepro-table glance\"><table><caption>One row per claim and setting; "
             "our figure in full, both scales and the caveats are in the note</caption>"
             "<thead><tr><th>claim</th><th>paper</th><th>ours</th><th>verdict</th>"
             "<th>note</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")
    return (table + legend_html([str(v) for v in claims["verdict"]])
            + "<h3>Notes: our figures in full, the scales and the caveats</h3>"
            "<ol class=\"notes\">" + "".join(notes) + "</ol>")
