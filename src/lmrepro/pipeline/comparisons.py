"""Quality comparisons: pairing runs by role and seed, the non-inferiority tests, the
testability of a verdict against the corpus's n-gram floor, and their table.

A comparison pairs a candidate configuration's runs with the baseline configuration's runs of
the same seed (:func:`lmrepro.pipeline.registry.pairings` says which roles are judged against
which), and the
per-batch losses by (seed, evaluation batch), so the test reports a batch-level and a seed-level
bound (:mod:`lmrepro.stats`).

Units. Eval losses are in nats; bits per byte is ``loss / ln 2``, so the relative difference
``(candidate - baseline) / baseline`` of the non-inferiority test is the same in both.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lmrepro.errors import check
from lmrepro.pipeline.records import ComparisonRecord
from lmrepro.pipeline import registry
from lmrepro.pipeline.runs import Run, Runs, config_label, load_runs, named_run, run_setting
from lmrepro.results import EVAL_LOSSES
from lmrepro.stats import NonInferiorityResult, StatsConfig, noninferiority

UNITS_NOTE = ("mean_rel_diff and the bounds are fractions of the baseline loss (0.01 = 1 %); "
              "bits per byte = nats / ln 2, so they are the same in nats and in bits per byte")
DEFAULT_STATS = StatsConfig()  # the design's test: 1 % margin, 95 %, 10 000 resamples, seed 0



@dataclass(frozen=True)
class Comparison:
    """Candidate run(s) judged against baseline run(s). Several runs (seeds) are paired
    position by position; their per-batch losses are concatenated and keyed by seed."""

    baseline: tuple[str, ...]
    candidate: tuple[str, ...]
    label: str = ""


@dataclass(frozen=True)
class ComparisonOutcome:
    """A comparison's record and its bootstrap (None when the candidate diverged: a non-finite
    eval loss counts as not non-inferior)."""

    record: ComparisonRecord
    result: NonInferiorityResult | None


ComparisonSpec = Comparison | tuple[str | Sequence[str], str | Sequence[str]]


def _as_comparison(spec: ComparisonSpec) -> Comparison:
    if isinstance(spec, Comparison):
        return spec
    check(isinstance(spec, (tuple, list)) and len(spec) == 2, "comparisons[i]", spec,
          "must be a Comparison or a (baseline, candidate) pair of run names")
    base, cand = ((x,) if isinstance(x, str) else tuple(x) for x in spec)
    return Comparison(baseline=base, candidate=cand, label=f"{'+'.join(cand)} vs {'+'.join(base)}")


def _group_key(run: Run) -> tuple:
    """``(role, where, setting, configuration)``: runs with the same key differ only in the
    seed; where they ran (corpus, world size) must match to compare. The setting
    (:func:`~lmrepro.pipeline.runs.run_setting`) to 6 decimals where it is a number."""
    setting = run_setting(run)
    if isinstance(setting, float):
        setting = round(setting, 6)
    return (run.role, (run.summary.corpus, run.world_size), setting, run.configuration)


def _pair_by_seed(base: list[Run], cand: list[Run]) -> list[tuple[Run, Run]]:
    """Pair runs of two configurations by seed; a lone run on each side pairs regardless."""
    if len(base) == 1 and len(cand) == 1:
        return [(base[0], cand[0])]
    by_seed = {r.summary.seed: r for r in base}
    return [(by_seed[c.summary.seed], c) for c in cand if c.summary.seed in by_seed]


def configurations(runs: Runs) -> dict[tuple, list[Run]]:
    """Runs grouped by :func:`_group_key` (replicates over seeds), each sorted by seed."""
    groups: dict[tuple, list[Run]] = {}
    for run in load_runs(runs).values():
        groups.setdefault(_group_key(run), []).append(run)
    for members in groups.values():
        members.sort(key=lambda r: (r.summary.seed, r.name))
    return groups


@dataclass(frozen=True)
class Pairing:
    """Two configurations' runs paired by seed, with their labels
    (:func:`~lmrepro.pipeline.runs.config_label`, with the learning rate where one role and
    setting ran at several configurations in one place)."""

    bases: list[Run]
    cands: list[Run]
    base_label: str
    cand_label: str

    @property
    def label(self) -> str:
        return f"{self.cand_label} vs {self.base_label} ({self.cands[0].summary.corpus})"


def pairings(runs: Runs) -> list[Pairing]:
    """Every configuration pair of :func:`~lmrepro.pipeline.registry.pairings` that ran in the
    same place (corpus, world size), its runs paired by seed."""
    groups = configurations(runs)
    several: dict[tuple, int] = {}
    for key in groups:
        several[key[:3]] = several.get(key[:3], 0) + 1
    out = []
    for cand_role, base_role in registry.pairings():
        for ckey, cands in groups.items():
            for bkey, bases in groups.items():
                if (ckey[0], bkey[0]) != (cand_role, base_role) or ckey[1] != bkey[1]:
                    continue
                if pairs := _pair_by_seed(bases, cands):
                    b, c = pairs[0]
                    out.append(Pairing([b for b, _ in pairs], [c for _, c in pairs],
                                       config_label(b, several[bkey[:3]] > 1),
                                       config_label(c, several[ckey[:3]] > 1)))
    return out


def default_comparisons(runs: Runs) -> list[Comparison]:
    """Comparisons implied by the runs' roles (:func:`~lmrepro.pipeline.registry.pairings`), per
    corpus.

    Runs of one configuration (role, corpus, setting, world size and the rest of the
    configuration) that differ only in seed are pooled, paired with the baseline
    configuration's runs of the same seed. A data-parallel candidate is compared with baselines
    of the same world size (RGC-suite runs have none).
    """
    return [Comparison(baseline=tuple(b.name for b in p.bases),
                       candidate=tuple(c.name for c in p.cands), label=p.label)
            for p in pairings(runs)]


def comparison_split(loaded: dict[str, Run], comp: Comparison) -> str:
    """``test`` when every finished run of the comparison scored the test split (the verdict's
    split: learning rates are tuned on the validation split), else ``val``."""
    names = [*comp.baseline, *comp.candidate]
    scored = [loaded[n] for n in names if loaded[n].eval_losses]
    return "test" if scored and all(r.test_losses for r in scored) else "val"


def _pooled_losses(loaded: dict[str, Run], comp: Comparison
                   ) -> tuple[list[float], list[float], list[int]]:
    """The paired per-batch losses of a comparison on :func:`comparison_split`, and the seed
    of each pair."""
    if comparison_split(loaded, comp) == "test":
        loaded = {n: dataclasses.replace(r, eval_losses=r.test_losses)
                  for n, r in loaded.items()}
    check(len(comp.baseline) == len(comp.candidate) and comp.baseline, "comparison",
          comp, "must pair as many baseline runs as candidate runs (at least one)")
    base_all: list[float] = []
    cand_all: list[float] = []
    seeds: list[int] = []
    for b_name, c_name in zip(comp.baseline, comp.candidate, strict=True):
        b = named_run(loaded, b_name, "comparison.baseline")
        c = named_run(loaded, c_name, "comparison.candidate")
        check(b.summary.corpus == c.summary.corpus, f"comparison {comp.label!r}",
              (b.summary.corpus, c.summary.corpus),
              "must compare runs evaluated on the same corpus")
        if c.summary.diverged_at_step is not None and not c.eval_losses:
            # a candidate that diverged before its evaluation: every pair is non-finite
            base_all += b.eval_losses
            cand_all += [math.nan] * len(b.eval_losses)
            seeds += [c.summary.seed] * len(b.eval_losses)
            continue
        check(len(b.eval_losses) == len(c.eval_losses), f"{c.path / EVAL_LOSSES}",
              f"<{len(c.eval_losses)} losses>",
              f"must be paired with {b.name!r}: the same {len(b.eval_losses)} eval batches")
        for key in ("batch_size", "context"):
            check(b.eval_meta.get(key) == c.eval_meta.get(key), f"{c.path / EVAL_LOSSES}: {key}",
                  c.eval_meta.get(key), f"must equal {b.name!r}'s {b.eval_meta.get(key)!r} "
                  "(the eval batches must be the same)")
        base_all += b.eval_losses
        cand_all += c.eval_losses
        seeds += [c.summary.seed] * len(c.eval_losses)
    return base_all, cand_all, seeds


def seed_caveats(n_seeds: int, min_seeds: int) -> list[str]:
    """What the number of training seeds leaves out of a quality verdict."""
    if n_seeds == 1:
        return ["one training seed: the bound reflects evaluation-batch noise only, not "
                "run-to-run variance"]
    if n_seeds < min_seeds:
        return [f"{n_seeds} training seeds: verdict from the batch-level bound (the seed-level "
                f"bound decides from {min_seeds} seeds)"]
    return []


def run_comparisons(runs: Runs, comparisons: Sequence[ComparisonSpec] | None = None, *,
                    stats: StatsConfig = DEFAULT_STATS,
                    floors: Mapping[str, Mapping[str, Any]] | None = None
                    ) -> list[ComparisonOutcome]:
    """Run :func:`lmrepro.stats.noninferiority` with ``stats`` for each comparison (default:
    :func:`default_comparisons`) on the pooled per-batch eval losses, paired by (seed, batch)."""
    loaded = load_runs(runs)
    comps = (default_comparisons(loaded) if comparisons is None
             else [_as_comparison(s) for s in comparisons])
    outcomes = []
    for comp in comps:
        base, cand, groups = _pooled_losses(loaded, comp)
        b, c = loaded[comp.baseline[0]], loaded[comp.candidate[0]]
        seeds = sorted(set(groups))
        bad = [i for i, x in enumerate(cand) if not math.isfinite(x)]
        r = None if bad else noninferiority(base, cand, margin=stats.margin,
                                            confidence=stats.confidence,
                                            n_resamples=stats.n_resamples, seed=stats.seed,
                                            groups=groups, min_groups=stats.min_seeds)
        diverged = sorted({loaded[n].summary.diverged_at_step for n in comp.candidate}
                          - {None})
        where = (f"at training step {diverged[0]}" if diverged
                 else f"non-finite eval loss at pooled batch {bad[0] if bad else -1}")
        note = (f"candidate diverged: {where}; counted as not non-inferior") if bad \
            else (r.fallback_reason or "")
        outcomes.append(ComparisonOutcome(ComparisonRecord(
            label=comp.label, corpus=c.summary.corpus, candidate_role=c.role,
            baseline_role=b.role, candidate_method=c.summary.method,
            baseline_method=b.summary.method, candidate_runs=list(comp.candidate),
            baseline_runs=list(comp.baseline), setting=run_setting(c),
            processes=c.summary.processes, n_pairs=len(cand), n_seeds=len(seeds), seeds=seeds,
            mean_rel_diff=r.mean_rel_diff if r else None,
            upper_bound=r.upper_bound if r else None,
            batch_upper_bound=r.batch_upper_bound if r else None,
            seed_upper_bound=r.seed_upper_bound if r else None,
            level="seed" if r and r.level == "seed" else "batch",
            margin=stats.margin, confidence=r.confidence if r else None,
            non_inferior=bool(r and r.non_inferior),
            verdict=r.verdict if r else "not non-inferior (diverged)",
            bootstrap_method=r.method if r else "", note=note,
            caveats=seed_caveats(len(seeds), stats.min_seeds),
            **_bounds(r), **testability(loaded, comp, floors)), r))
    return outcomes


def _bounds(r: Any) -> dict[str, Any]:
    if r is None:
        return {}
    return {"lower_bound": r.lower_bound, "seed_lower_bound": r.seed_lower_bound,
            "p_value": r.p_value, "worse": r.worse}


def testability(loaded: dict[str, Run], comp: Comparison,
                floors: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """The comparison's split, its baseline's mean final bits per byte there, the corpus's
    trigram floor on it and whether the baseline is far enough below it for a quality verdict
    (:func:`lmrepro.data.ngram.testable`); testable when no floor is known."""
    from lmrepro.data.ngram import testable

    split = comparison_split(loaded, comp)
    base = [loaded[n] for n in comp.baseline]
    values = [(b.summary.final_bpb if split == "val"
               else float(np.mean(b.test_losses)) / math.log(2))
              for b in base if b.summary.final_bpb is not None]
    bpb = float(np.mean(values)) if values else None
    floor = (floors or {}).get(base[0].summary.corpus, {}).get("trigram", {}).get(split)
    ok = True if floor is None or bpb is None else testable(bpb, float(floor))
    return {"split": split, "baseline_bpb": bpb, "floor_bpb": floor, "testable": ok}


def outcomes_table(outcomes: Sequence[ComparisonOutcome]) -> pd.DataFrame:
    """Per comparison: baseline, candidate, corpus, seeds, pairs, mean relative difference
    ``mean(d)``, the batch-level and seed-level one-sided upper bounds, the bound the verdict
    uses (``upper_bound``, from ``level``), the margin, the verdict (``upper_bound < margin``)
    and the caveats.

    ``mean_rel_diff`` and the bounds are fractions (0.01 = 1 %) and identical whether the
    losses are read as nats or bits per byte (bpb = nats / ln 2 cancels in the ratio).
    """
    nan = float("nan")

    def num(x: float | None) -> float:
        return nan if x is None else x

    rows = [{
        "comparison": c.label, "corpus": c.corpus, "baseline": "+".join(c.baseline_runs),
        "candidate": "+".join(c.candidate_runs), "baseline_method": c.baseline_method,
        "candidate_method": c.candidate_method, "seeds": c.n_seeds,
        "mean_rel_diff": num(c.mean_rel_diff), "batch_upper_bound": num(c.batch_upper_bound),
        "seed_upper_bound": num(c.seed_upper_bound), "upper_bound": num(c.upper_bound),
        "lower_bound": num(c.lower_bound), "p_value": num(c.p_value), "split": c.split,
        "level": c.level, "margin": c.margin, "verdict": c.verdict,
        "non_inferior": c.non_inferior, "testable": c.testable,
        "baseline_bpb": num(c.baseline_bpb), "trigram_floor_bpb": num(c.floor_bpb),
        "pairs": c.n_pairs, "method": c.bootstrap_method,
        "confidence": num(c.confidence), "note": c.note, "caveats": "; ".join(c.caveats)}
        for c in (o.record for o in outcomes)]
    columns = ["comparison", "corpus", "baseline", "candidate", "baseline_method",
               "candidate_method", "seeds", "split", "mean_rel_diff", "lower_bound",
               "batch_upper_bound", "seed_upper_bound", "upper_bound", "p_value", "level",
               "margin", "verdict", "non_inferior", "testable", "baseline_bpb",
               "trigram_floor_bpb", "pairs", "method", "confidence", "note", "caveats"]
    df = pd.DataFrame(rows, columns=columns)
    df.attrs["note"] = UNITS_NOTE
    return df


def noninferiority_table(runs: Runs, comparisons: Sequence[ComparisonSpec] | None = None, *,
                         stats: StatsConfig = DEFAULT_STATS) -> pd.DataFrame:
    """:func:`outcomes_table` of :func:`run_comparisons`."""
    return outcomes_table(run_comparisons(runs, comparisons, stats=stats))
