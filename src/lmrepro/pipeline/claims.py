"""The claims registry: each paper's headline claims beside our figures, from ``analysis.json``.

A :class:`Claim` is declared once, in its paper's wing (:mod:`lmrepro.scape.claims`,
:mod:`lmrepro.rgc.claims`): its text, the paper's figure and scale (quoted, with their source),
the rule our measurement is judged by, and the function that measures it from the analysis
stages' records (:class:`~lmrepro.pipeline.analysis.AnalysisRecords`). The claims stage only reads
those records: no run directory is opened and no bootstrap is recomputed here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lmrepro.errors import check
from lmrepro.io import atomic_write_json, atomic_write_text
from lmrepro.pipeline.analysis import (DEFAULT_STATS, AnalysisRecords, ComparisonRecord, RunRecord,
                                       read_analysis)

NOT_RUN = "not run in this profile"
STAGES = ("scape", "rgc")


@dataclass(frozen=True)
class Measured:
    """Our figure for a claim in one setting (e.g. one corpus)."""

    corpus: str
    measured: str        # the figure, in words
    value: float         # the number behind it: a fraction or a ratio (nan when diverged)
    reproduced: bool
    scale: str           # our scale (:func:`lmrepro.pipeline.analysis.run_scale`)


Measure = Callable[[AnalysisRecords], list[Measured]]


@dataclass(frozen=True)
class Claim:
    """A headline claim of one of the papers (DESIGN.md, "The two papers").

    ``paper_figure`` and ``paper_scale`` are the paper's, quoted from ``source`` (the papers'
    tables and figures were not available to us: DESIGN.md quotes the SCAPE abstract and a
    summary of the RGC paper); ``rule`` says how ``measure``'s figure is judged."""

    id: str
    paper: str
    claim: str
    paper_figure: str
    source: str
    paper_scale: str
    rule: str
    measure: Measure = field(repr=False, compare=False)


def registry() -> tuple[Claim, ...]:
    """Every claim: SCAPE's, then RGC's (imported here: the wings import this module)."""
    from lmrepro.rgc.claims import CLAIMS as RGC_CLAIMS
    from lmrepro.scape.claims import CLAIMS as SCAPE_CLAIMS

    return SCAPE_CLAIMS + RGC_CLAIMS


def ni_text(c: ComparisonRecord) -> str:
    """A non-inferiority result in words: mean d, U, margin, verdict, pairs, bootstrap method."""
    if c.mean_rel_diff is None or c.upper_bound is None:
        return f"diverged ({c.note}); {c.n_pairs} pairs"
    return (f"mean d {c.mean_rel_diff * 100:+.3f} %, U {c.upper_bound * 100:+.3f} % (margin "
            f"{c.margin:.1%}): {c.verdict}; {c.n_pairs} pairs, {c.bootstrap_method}")


def ni_value(c: ComparisonRecord) -> float:
    """The mean relative difference (nan for a diverged candidate)."""
    return math.nan if c.mean_rel_diff is None else c.mean_rel_diff


def comparisons(records: AnalysisRecords, candidate: str, baseline: str
                ) -> list[ComparisonRecord]:
    """The comparisons of a ``candidate`` role against a ``baseline`` role."""
    return [c for c in records.comparisons
            if c.candidate_role == candidate and c.baseline_role == baseline]


def noninferiority_measure(candidate: str, baseline: str, *, non_inferior: bool,
                           sparsity: float | None = None, corpus: str | None = None) -> Measure:
    """Measure of a verdict claim: each comparison of ``candidate`` against ``baseline`` (at
    ``sparsity``, on the corpus named ``corpus`` when given) is reproduced iff its verdict
    is ``non_inferior``."""
    def measure(records: AnalysisRecords) -> list[Measured]:
        out = []
        for c in comparisons(records, candidate, baseline):
            if sparsity is not None and (c.sparsity is None or abs(c.sparsity - sparsity) > 1e-6):
                continue
            if corpus is not None and c.corpus != corpus:
                continue
            scale = records.run(c.candidate_runs[0]).scale
            out.append(Measured(c.corpus, ni_text(c), ni_value(c),
                                c.non_inferior == non_inferior,
                                f"{scale}; {c.n_pairs} eval batches"))
        return out
    return measure


def same_setting(a: RunRecord, b: RunRecord) -> bool:
    """Same corpus and world size (None for both runs of the RGC suite)."""
    return a.corpus == b.corpus and a.world_size == b.world_size


def runs_of(records: AnalysisRecords, *roles: str) -> list[RunRecord]:
    """The run records of the given roles, in the analysis's order."""
    return [r for r in records.runs if r.role in roles]


def claims_table(records: AnalysisRecords, claims: Sequence[Claim] | None = None
                 ) -> pd.DataFrame:
    """Each claim (default: :func:`registry`) beside our measured figure.

    Columns: ``id``, ``paper``, ``claim``, ``paper_figure`` (the paper's, labelled ``paper:``),
    ``paper_scale``, ``measured``, ``measured_value`` (the number behind it: a fraction or a
    ratio), ``our_scale``, ``corpus``, ``rule`` and ``reproduced`` (``yes``, ``no`` or ``not run
    in this profile`` when the records hold nothing the claim measures). A claim measured in
    several settings (e.g. two corpora) gets one row each.
    """
    rows = []
    for claim in registry() if claims is None else claims:
        base = {"id": claim.id, "paper": claim.paper, "claim": claim.claim,
                "paper_figure": claim.paper_figure, "paper_scale": claim.paper_scale}
        measured = claim.measure(records)
        if not measured:
            rows.append({**base, "measured": NOT_RUN, "measured_value": math.nan,
                         "our_scale": "", "corpus": "", "rule": claim.rule,
                         "reproduced": NOT_RUN})
        rows += [{**base, "measured": m.measured, "measured_value": m.value,
                  "our_scale": m.scale, "corpus": m.corpus, "rule": claim.rule,
                  "reproduced": "yes" if m.reproduced else "no"} for m in measured]
    return pd.DataFrame(rows)


def merge_records(by_stage: Mapping[str, AnalysisRecords]) -> AnalysisRecords:
    """One record set of several stages' analyses (made with the same test settings), run names
    prefixed ``<stage>/`` so that runs of two stages never collide."""
    stats = {rec.stats for rec in by_stage.values()} or {DEFAULT_STATS}
    check(len(stats) == 1, "stats", stats, "must be the same for every stage: rerun the analyses")
    runs, comps = [], []
    for stage, rec in by_stage.items():
        runs += [r.model_copy(update={"name": f"{stage}/{r.name}"}) for r in rec.runs]
        comps += [c.model_copy(update={"candidate_runs": [f"{stage}/{n}" for n in c.candidate_runs],
                                       "baseline_runs": [f"{stage}/{n}" for n in c.baseline_runs]})
                  for c in rec.comparisons]
    return AnalysisRecords(stage="+".join(by_stage), stats=stats.pop(), runs=runs,
                           comparisons=comps)


def claims_stage(analysis_root: str | Path = "results/analysis",
                 out_root: str | Path = "results/analysis") -> pd.DataFrame:
    """The claims table from ``analysis_root/<stage>/analysis.json`` of each stage in
    :data:`STAGES` (a missing stage's claims are ``not run in this profile``); writes
    ``out_root/claims.csv`` and the DVC metric ``out_root/claims.json``."""
    table = claims_table(merge_records({
        stage: read_analysis(path) for stage in STAGES
        if (path := Path(analysis_root) / stage / "analysis.json").exists()}))
    atomic_write_text(Path(out_root) / "claims.csv", table.to_csv(index=False))
    counts = table["reproduced"].value_counts().to_dict()
    atomic_write_json(Path(out_root) / "claims.json", {
        "claims": len(table), "reproduced_yes": int(counts.get("yes", 0)),
        "reproduced_no": int(counts.get("no", 0)), "not_run": int(counts.get(NOT_RUN, 0))})
    return table
