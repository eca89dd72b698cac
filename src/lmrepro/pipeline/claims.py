"""The claims registry: each paper's headline claims beside our figures, from ``analysis.json``.

A :class:`Claim` is declared once, in its paper's wing (e.g. the SCAPE wing's ``claims`` module),
whose value names that module (:attr:`lmrepro.pipeline.registry.Wing.claims`): its text, the paper's
figure and scale (quoted, with their source), the rule our measurement is judged by, a caveat that
weakens any verdict on it, and the function that measures it from the analysis stages' records
(:class:`~lmrepro.pipeline.records.AnalysisRecords`). The claims stage only reads those records
and the timing history (the timed pairings' sessions, pooled into the records:
:mod:`lmrepro.pipeline.timing_history`): no run directory is opened and no bootstrap is
recomputed here.

Verdicts. A measured claim is ``reproduced`` (our figure agrees with the paper's within the
tolerance its rule states), ``reproduced in direction only`` (the same direction, outside that
tolerance), ``not reproduced``; a claim with a figure declares its tolerance
(:class:`Tolerance`, shown beside the paper's figure) and is judged by the one rule of
:func:`label`. Further verdicts: ``inconclusive`` (a :class:`Measured` whose ``reproduced`` is
None: e.g. a timing difference inside the step-time spread, :func:`timing_verdict`) or ``not
testable at this scale`` (a quality verdict whose dense baseline is not at least 10 % below the
corpus's trigram floor: :func:`lmrepro.data.ngram.testable`); a claim with nothing to measure in
this profile is ``not run``, one that no experiment here can test ``not testable here``. A row
of kind :data:`AUTHORS_LOGS` takes its figure from the papers' authors' own logs, not from a run
of ours: where it agrees with the claim its verdict says so, ``consistent with the authors'
logs`` (never ``reproduced``: we did not run it); where no log measures the paper's figure
(only a model fitted to them extrapolates to it) the verdict is ``not measured in the authors'
logs``, the model's figure beside it labelled as its extrapolation with its validated error.

Caveats travel with the verdict: the claim's declared caveat, and those its measure computes
(one seed, too few seeds for the seed-level bound, oversubscribed runs, a timing difference inside
its spread, ...) go to the claims table, the claims report and the index's "Results at a glance".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lmrepro.errors import check
from lmrepro.io import atomic_write_json, atomic_write_text
from lmrepro.pipeline import registry as _registry
from lmrepro.pipeline.comparisons import DEFAULT_STATS
from lmrepro.pipeline.records import (AnalysisRecords, ComparisonRecord, PooledTiming,
                                      ResourceRecord, read_analysis)
from lmrepro.pipeline.resources import (MIN_TIMED_STEPS, timing_interval,  # noqa: F401
                                        timing_untestable)
from lmrepro.pipeline.timing_history import HISTORY_FILE, pool_records, read_history

REPRODUCED = "reproduced"
DIRECTION_ONLY = "reproduced in direction only"
#: a figure with an interval, in the paper's direction, whose interval misses the paper's figure
LARGER = "same direction, larger than the paper's"
SMALLER = "same direction, smaller than the paper's"
CONSISTENT_WITH_LOGS = "consistent with the authors' logs"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable at this scale"
NOT_TESTABLE_HERE = "not testable here"
NOT_MEASURED_IN_LOGS = "not measured in the authors' logs"
NOT_RUN = "not run"
VERDICTS = (REPRODUCED, DIRECTION_ONLY, LARGER, SMALLER, CONSISTENT_WITH_LOGS, NOT_REPRODUCED,
            INCONCLUSIVE, NOT_TESTABLE, NOT_TESTABLE_HERE, NOT_MEASURED_IN_LOGS, NOT_RUN)
#: the measured column of a claim that this profile does not run
NOT_RUN_TEXT = "not run in this profile"
#: the ``kind`` of a row that a model predicts at the paper's scale instead of measuring ours
PREDICTED = "predicted at the paper's scale"
#: the ``kind`` of a row measured in the papers' authors' own logs (with our model beside it)
AUTHORS_LOGS = "measured in the authors' logs"
#: the caveats column joins the caveats with this separator
CAVEAT_SEPARATOR = "; "
#: how a measured text introduces a steps-to-target multiplier (glance keeps it beside the gap)
STEPS_TO_TARGET = "steps to target:"
#: how a measured text introduces a timing pooled over sessions (glance keeps it: the verdict
#: rests on it)
POOLED = "pooled over"


@dataclass(frozen=True)
class Measured:
    """Our figure for a claim in one setting (e.g. one corpus).

    ``reproduced`` is None when the measurement cannot decide (inconclusive); ``caveats`` are
    what weakens this verdict (computed by the measure function)."""

    corpus: str
    measured: str        # the figure, in words
    value: float         # the number behind it: a fraction or a ratio (nan when diverged)
    reproduced: bool | None
    scale: str           # our scale (:func:`lmrepro.pipeline.runs.run_scale`)
    caveats: tuple[str, ...] = ()
    kind: str = "measured"   # or PREDICTED, AUTHORS_LOGS: not a run of ours
    testable: bool = True    # False: the models did not learn enough for a quality verdict
    direction_only: bool = False   # reproduced in direction, outside the rule's tolerance
    #: with ``direction_only``, a figure with an interval: True where the interval lies above
    #: the paper's figure, False below (None: no interval, plain "direction only")
    larger: bool | None = None
    untestable_here: bool = False  # no experiment of this package can test the claim
    #: an authors'-logs row whose figure no log measures (only a model extrapolates to it)
    not_measured: bool = False
    lower: float | None = None     # a comparison's bounds on ``value`` (its verdict's level)
    upper: float | None = None

    @property
    def verdict(self) -> str:
        """One of :data:`VERDICTS` but ``not run``."""
        if self.untestable_here:
            return NOT_TESTABLE_HERE
        if self.not_measured:
            return NOT_MEASURED_IN_LOGS
        if not self.testable:
            return NOT_TESTABLE
        if self.reproduced is None:
            return INCONCLUSIVE
        if self.reproduced:
            if self.kind == AUTHORS_LOGS:
                return CONSISTENT_WITH_LOGS
            if not self.direction_only:
                return REPRODUCED
            return DIRECTION_ONLY if self.larger is None else LARGER if self.larger else SMALLER
        return NOT_REPRODUCED


Measure = Callable[[AnalysisRecords], list[Measured]]


@dataclass(frozen=True)
class Tolerance:
    """A claim's stated tolerance: how close our figure must lie to the paper's figure
    ``paper`` to reproduce it, under the one labelling rule (:func:`label`).

    The band is ``[low, high]``: by default ``paper`` times ``1 -+ relative``, or with ``log``
    (for ratios, symmetric on the log scale) ``paper / (1 + relative)`` to ``paper * (1 +
    relative)``; :meth:`band` gives it explicitly. ``reference`` is the value whose side of it
    is the claim's direction (1 for a ratio, 0 for a difference): our figure agrees in direction
    iff it lies on the paper's side of it. ``unit`` is how figures are printed (``"x"``: a
    ratio; ``"%"``: a fraction shown in per cent)."""

    paper: float
    relative: float = 0.0
    reference: float = 1.0
    log: bool = False
    unit: str = "x"
    low: float | None = None
    high: float | None = None

    @classmethod
    def band(cls, paper: float, low: float, high: float, reference: float, unit: str
             ) -> Tolerance:
        check(low <= paper <= high, "tolerance", (low, paper, high),
              "must hold the paper's figure: low <= paper <= high")
        return cls(paper, reference=reference, unit=unit, low=low, high=high)

    def bounds(self) -> tuple[float, float]:
        if self.low is not None and self.high is not None:
            return self.low, self.high
        if self.log:
            return self.paper / (1 + self.relative), self.paper * (1 + self.relative)
        return self.paper * (1 - self.relative), self.paper * (1 + self.relative)

    def within(self, x: float) -> bool:
        low, high = self.bounds()
        return math.isfinite(x) and low <= x <= high

    def same_direction(self, x: float) -> bool:
        return math.isfinite(x) and (x - self.reference) * (self.paper - self.reference) > 0

    def fmt(self, x: float) -> str:
        return f"{x * 100:.4g} %" if self.unit == "%" else f"{x:.4g}{self.unit}"

    def text(self) -> str:
        """The tolerance in words, e.g. ``within 10 % of 1.382x: 1.244x to 1.52x``."""
        low, high = self.bounds()
        how = (f"within {self.relative * 100:.3g} % of {self.fmt(self.paper)}" if self.low is None
               else f"around {self.fmt(self.paper)}")
        return f"{how}: {self.fmt(low)} to {self.fmt(high)}"


def interval_label(value: float, lower: float | None, upper: float | None,
                   tolerance: Tolerance) -> tuple[bool | None, bool, bool | None]:
    """``(reproduced, direction_only, larger)`` of a quality figure with its interval
    ``[lower, upper]``: *reproduced* iff the interval holds the paper's figure (our figure is
    then consistent with the paper's, not merely inside a band around it); else, on the
    paper's side of the reference, *larger* (the interval above the paper's figure) or
    *smaller* (below it); else not reproduced. Without an interval: :func:`label`."""
    if lower is None or upper is None or not math.isfinite(value):
        ok, direction = label(value, tolerance)
        return ok, direction, None
    paper = tolerance.paper
    if lower <= paper <= upper:
        return True, False, None
    if tolerance.same_direction(value):
        return True, True, lower > paper
    return False, False, None


def label(value: float, tolerance: Tolerance, decided: bool = True
          ) -> tuple[bool | None, bool]:
    """``(reproduced, direction_only)`` of a :class:`Measured` under the one labelling rule of
    every claim with a figure: *reproduced* iff ``value`` lies within the claim's stated
    ``tolerance`` of the paper's figure; *reproduced in direction only* iff outside it but on the
    paper's side of the reference (the sign agrees); *not reproduced* otherwise (a non-finite
    value included); *inconclusive* (None) when the measurement cannot decide (``decided``
    False: a timing difference inside its spread)."""
    if not decided:
        return None, False
    if tolerance.within(value):
        return True, False
    if tolerance.same_direction(value):
        return True, True
    return False, False


@dataclass(frozen=True)
class Claim:
    """A headline claim of one of the papers (docs/papers.md).

    ``paper_figure`` and ``paper_scale`` are the paper's, quoted from ``source`` (the papers'
    tables and figures were not available to us: docs/papers.md quotes the SCAPE abstract and a
    summary of the RGC paper); ``rule`` says how ``measure``'s figure is judged; ``caveat``
    (declared with the claim) is shown with every verdict on it."""

    id: str
    paper: str
    claim: str
    paper_figure: str
    source: str
    paper_scale: str
    rule: str
    measure: Measure = field(repr=False, compare=False)
    caveat: str = ""
    #: the stated tolerance the figure is judged by (:func:`label`); shown beside the paper's
    #: figure in every claims table
    tolerance: Tolerance | None = None

    @property
    def paper_figure_text(self) -> str:
        """The paper's figure with the tolerance it is judged by."""
        if self.tolerance is None:
            return self.paper_figure
        return f"{self.paper_figure} (reproduced iff {self.tolerance.text()})"


def registry() -> tuple[Claim, ...]:
    """Every claim the wings declare (:attr:`lmrepro.pipeline.registry.Wing.claims`), in the
    wings' order: SCAPE's, then RGC's."""
    return _registry.claims()


# --------------------------------------------------------------------------------------------
# Helpers of the measure functions
# --------------------------------------------------------------------------------------------

def ni_text(c: ComparisonRecord) -> str:
    """A non-inferiority result in words: mean d with the verdict's bounds [L, U] and their
    level, the sign-flip p-value, the other level's bound, margin, verdict, split, seeds and
    pairs, and the baseline against the trigram floor; a steps-to-target multiplier beside the
    gap where the record has one."""
    if c.mean_rel_diff is None or c.upper_bound is None:
        return f"diverged ({c.note}); {c.n_pairs} pairs"
    other = ""
    if c.level == "seed" and c.batch_upper_bound is not None:
        other = f"; batch-level U {c.batch_upper_bound * 100:+.3g} %"
    elif c.seed_upper_bound is not None:
        other = f"; seed-level U {c.seed_upper_bound * 100:+.3g} %"
    lower = "" if c.lower_bound is None else f"L {c.lower_bound * 100:+.3g} %, "
    p = "" if c.p_value is None or c.level != "seed" else f", sign-flip p {c.p_value:.3g}"
    seeds = f"{c.n_seeds} seed{'s' * (c.n_seeds != 1)}"
    floor = ""
    if c.baseline_bpb is not None and c.floor_bpb is not None:
        floor = (f"; baseline {c.baseline_bpb:.3f} bits/byte vs trigram floor "
                 f"{c.floor_bpb:.3f}")
    steps = "" if c.steps_to_target is None else f"; {STEPS_TO_TARGET} {c.steps_to_target}"
    return (f"mean d {c.mean_rel_diff * 100:+.3g} %, {lower}U {c.upper_bound * 100:+.3g} % "
            f"({c.level} level{other}{p}; margin {c.margin:.1%}): {c.verdict}{steps}; "
            f"{c.split} split, {seeds}, {c.n_pairs} pairs{floor}")


def ni_value(c: ComparisonRecord) -> float:
    """The mean relative difference (nan for a diverged candidate)."""
    return math.nan if c.mean_rel_diff is None else c.mean_rel_diff


def comparisons(records: AnalysisRecords, candidate: str, baseline: str
                ) -> list[ComparisonRecord]:
    """The comparisons of a ``candidate`` role against a ``baseline`` role."""
    return [c for c in records.comparisons
            if c.candidate_role == candidate and c.baseline_role == baseline]


def resources(records: AnalysisRecords, candidate: str, *baselines: str) -> list[ResourceRecord]:
    """The timing and memory comparisons of a ``candidate`` role against ``baselines`` roles."""
    return [r for r in records.resources
            if r.candidate_role == candidate and r.baseline_role in baselines]


def comparison_scale(records: AnalysisRecords, candidate_runs: Sequence[str],
                     extra: str = "") -> str:
    """Our scale for a comparison: its first candidate run's scale and the number of seeds."""
    n = len(candidate_runs)
    text = f"{records.run(candidate_runs[0]).scale}; {n} seed{'s' * (n != 1)}"
    return f"{text}; {extra}" if extra else text


def timing_verdict(holds: bool, conclusive: bool) -> bool | None:
    """A timing claim's outcome: whether its direction ``holds`` when the difference is
    conclusive (outside the step-time spread), else None (inconclusive)."""
    return holds if conclusive else None


def spread_text(r: ResourceRecord, ratio: float | None = None,
                halfwidth: float | None = None) -> str:
    """The spread a timing verdict rests on, in words (``docs/statistics.md``): the run-level
    interval of ``ratio`` (its half-width ``halfwidth``) over the seeds, or with one run a side
    the step-time spread."""
    if r.timing_basis == "runs" and ratio is not None and halfwidth is not None:
        low, high, _ = timing_interval(ratio, halfwidth)
        return f"run-level 95 % interval {low:.3g}x to {high:.3g}x over {r.timing_pairs} seeds"
    if r.relative_spread is None:
        return "no step-time spread recorded"
    return f"step-time spread ±{r.relative_spread:.0%}"


def pooled_text(p: PooledTiming, r: ResourceRecord) -> str:
    """A ratio pooled over the sessions of its suite (:mod:`lmrepro.pipeline.timing_history`),
    in words; with one session, that the seed-level interval decides."""
    where = r.machine.text() if r.machine is not None else "this machine"
    if p.basis == "sessions" and p.low is not None and p.high is not None:
        return (f"{POOLED} {p.sessions} sessions ({p.seeds} seeds) on {where}: "
                f"{p.ratio:.3g}x [{p.low:.3g}, {p.high:.3g}] (session-level "
                f"{p.confidence * 100:.3g} % t interval)")
    return (f"one session of this suite recorded on {where}: judged on its seed-level "
            "interval")


def noninferiority_measure(
        candidate: str, baseline: str, *, non_inferior: bool, setting: float | None = None,
        corpus: str | None = None,
        extra_caveats: Callable[[ComparisonRecord, AnalysisRecords], tuple[str, ...]]
        | None = None) -> Measure:
    """Measure of a verdict claim: each comparison of ``candidate`` against ``baseline`` (at
    ``setting``, on the corpus named ``corpus`` when given) is reproduced iff its verdict
    is ``non_inferior``; the comparison's caveats come along, and ``extra_caveats``' (a wing's
    own facts about the comparison's runs)."""
    def measure(records: AnalysisRecords) -> list[Measured]:
        out = []
        for c in comparisons(records, candidate, baseline):
            if setting is not None and (c.setting is None or abs(c.setting - setting) > 1e-6):
                continue
            if corpus is not None and c.corpus != corpus:
                continue
            per_seed = c.n_pairs // max(1, c.n_seeds)
            scale = comparison_scale(records, c.candidate_runs,
                                     f"{per_seed} eval batches per seed")
            out.append(Measured(c.corpus, ni_text(c), ni_value(c),
                                c.non_inferior == non_inferior, scale,
                                tuple(c.caveats) + untestable_caveat(c)
                                + (extra_caveats(c, records) if extra_caveats else ()),
                                testable=c.testable, lower=c.lower_bound, upper=c.upper_bound))
        return out
    return measure


def untestable_caveat(c: ComparisonRecord) -> tuple[str, ...]:
    """Why a comparison is no quality verdict, when its baseline has not left the n-gram floor."""
    if c.testable or c.baseline_bpb is None or c.floor_bpb is None:
        return ()
    return (f"the dense baseline ends at {c.baseline_bpb:.3f} bits/byte, not 10 % below the "
            f"corpus's trigram floor ({c.floor_bpb:.3f}, {c.split} split): the models have not "
            "learned what the claim is about",)


# --------------------------------------------------------------------------------------------
# The table and the stage
# --------------------------------------------------------------------------------------------

CLAIM_COLUMNS = ["id", "paper", "claim", "paper_figure", "paper_scale", "measured",
                 "measured_value", "our_scale", "corpus", "rule", "verdict", "caveats", "kind"]


def _caveats(*parts: str) -> str:
    seen: list[str] = []
    for part in parts:
        if part and part not in seen:
            seen.append(part)
    return CAVEAT_SEPARATOR.join(seen)


def claims_table(records: AnalysisRecords, claims: Sequence[Claim] | None = None, *,
                 bounds: bool = False) -> pd.DataFrame:
    """Each claim (default: :func:`registry`) beside our measured figure.

    Columns (:data:`CLAIM_COLUMNS`): ``id``, ``paper``, ``claim``, ``paper_figure`` (the
    paper's, labelled ``paper:``), ``paper_scale``, ``measured``, ``measured_value`` (the number
    behind it: a fraction or a ratio), ``our_scale``, ``corpus``, ``rule``, ``verdict`` (one of
    :data:`VERDICTS`) and ``caveats`` (the declared caveat, then the measured ones, joined by
    ``"; "``). A claim measured in several settings (e.g. two corpora) gets one row each.
    ``bounds``: two more columns, ``lower`` and ``upper``, a comparison's bounds on
    ``measured_value`` (None for other claims).
    """
    rows = []
    for claim in registry() if claims is None else claims:
        base = {"id": claim.id, "paper": claim.paper, "claim": claim.claim,
                "paper_figure": claim.paper_figure_text, "paper_scale": claim.paper_scale,
                "rule": claim.rule}
        measured = claim.measure(records)
        if not measured:
            rows.append({**base, "measured": NOT_RUN_TEXT, "measured_value": math.nan,
                         "our_scale": "", "corpus": "", "verdict": NOT_RUN,
                         "caveats": _caveats(claim.caveat), "kind": "measured"})
        rows += [{**base, "measured": m.measured, "measured_value": m.value,
                  "our_scale": m.scale, "corpus": m.corpus, "verdict": m.verdict,
                  "caveats": _caveats(claim.caveat, *m.caveats), "kind": m.kind,
                  "lower": m.lower, "upper": m.upper}
                 for m in measured]
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS + ["lower", "upper"] * bounds)


def verdict_counts(table: pd.DataFrame) -> dict[str, int]:
    """``claims`` (rows) and the number of rows of each verdict (the DVC metric)."""
    counts = table["verdict"].value_counts().to_dict()
    return {"claims": len(table), **{verdict_key(v): int(counts.get(v, 0)) for v in VERDICTS}}


def verdict_key(verdict: str) -> str:
    """A verdict as a metric key or CSS class word list: its letters and digits, joined by
    ``_`` (``consistent with the authors' logs`` -> ``consistent_with_the_authors_logs``)."""
    return "_".join(re.findall(r"[a-z0-9]+", verdict.lower()))


def merge_records(by_stage: Mapping[str, AnalysisRecords]) -> AnalysisRecords:
    """One record set of several stages' analyses (made with the same test settings), run names
    prefixed ``<stage>/`` so that runs of two stages never collide."""
    stats = {rec.stats for rec in by_stage.values()} or {DEFAULT_STATS}
    check(len(stats) == 1, "stats", stats, "must be the same for every stage: rerun the analyses")
    runs, comps, res = [], [], []
    seeds: set[int] = set()
    cores = [rec.cores for rec in by_stage.values() if rec.cores is not None]

    def prefixed(stage: str, names: list[str]) -> list[str]:
        return [f"{stage}/{n}" for n in names]

    for stage, rec in by_stage.items():
        seeds |= set(rec.seeds)
        runs += [r.model_copy(update={"name": f"{stage}/{r.name}"}) for r in rec.runs]
        comps += [c.model_copy(update={"candidate_runs": prefixed(stage, c.candidate_runs),
                                       "baseline_runs": prefixed(stage, c.baseline_runs)})
                  for c in rec.comparisons]
        res += [r.model_copy(update={"candidate_runs": prefixed(stage, r.candidate_runs),
                                     "baseline_runs": prefixed(stage, r.baseline_runs)})
                for r in rec.resources]
    return AnalysisRecords(stage="+".join(by_stage), stats=stats.pop(), seeds=sorted(seeds),
                           cores=min(cores) if cores else None, runs=runs, comparisons=comps,
                           resources=res)


def read_stage_records(analysis_root: str | Path = "results/analysis") -> AnalysisRecords:
    """The merged records of every stage in :data:`STAGES` that has an ``analysis.json``."""
    return merge_records({
        stage: read_analysis(path) for stage in _registry.record_stages()
        if (path := Path(analysis_root) / stage / "analysis.json").exists()})


def claims_stage(analysis_root: str | Path = "results/analysis",
                 out_root: str | Path = "results/analysis",
                 timing_history: str | Path | None = HISTORY_FILE) -> pd.DataFrame:
    """The claims table from ``analysis_root/<stage>/analysis.json`` of each stage in
    :data:`STAGES` (a missing stage's claims are ``not run``), the timed pairings' throughput
    pooled over the sessions of the ``timing_history`` file (None: none;
    :func:`lmrepro.pipeline.timing_history.pool_records`); writes ``out_root/claims.csv``,
    the DVC metric ``out_root/claims.json`` (:func:`verdict_counts`) and the forest plot of
    every comparison, ``out_root/forest.png``; the headline metrics, one per claim
    (:mod:`lmrepro.pipeline.headline`)."""
    from lmrepro.pipeline import plots

    from lmrepro.pipeline.headline import claim_items, metrics_dir, write_headline

    records = read_stage_records(analysis_root)
    if timing_history is not None:
        records = pool_records(records, read_history(timing_history))
    full = claims_table(records, bounds=True)
    table = full[CLAIM_COLUMNS]
    atomic_write_text(Path(out_root) / "claims.csv", table.to_csv(index=False))
    atomic_write_json(Path(out_root) / "claims.json", verdict_counts(table))
    write_headline(metrics_dir(out_root, "claims"), claim_items(full))
    plots.save_figure(plots.plot_forest(records.comparisons), Path(out_root) / "forest.png")
    return table
