"""Resources: per-run throughput, memory and communication tables against a reference run, and
the timing and memory comparisons of configurations with the spread of their step times.

Timing. A timing comparison (:class:`~lmrepro.pipeline.records.ResourceRecord`) is judged on
its runs: with two or more seeds a side, the per-seed ratios (paired by seed) give a run-level
95 % t interval, and a ratio whose interval contains 1 is inconclusive; the step-to-step
jitter within a run does not decide. With one run a side there is no run-to-run spread, and the
step-time spread stands in for it, with a caveat (:func:`run_halfwidth`, :func:`timing_interval`,
``docs/statistics.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lmrepro.errors import check
from lmrepro.pipeline import registry
from lmrepro.pipeline.comparisons import pairings
from lmrepro.pipeline.records import Machine, ResourceRecord
from lmrepro.pipeline.runs import (GIB, Run, Runs, config_label, load_runs, named_run,
                                   run_setting, suite_identity, suite_key, workers)
from lmrepro.results import TOTAL
from lmrepro.stats import t_bounds


# --------------------------------------------------------------------------------------------
# Throughput, memory, communication of each run
# --------------------------------------------------------------------------------------------

def throughput_table(runs: Runs, baseline: str) -> pd.DataFrame:
    """Per run: method, corpus, seed, tokens/s, mean step time (and its per-step standard
    deviation) and the ratios against ``baseline``.

    ``speedup`` is the per-step speedup ``baseline mean_step_time_s / run mean_step_time_s`` (the
    SCAPE "x faster per step"); ``throughput_ratio`` is ``run tokens_per_s / baseline
    tokens_per_s`` (the RGC "x the throughput").
    """
    loaded = load_runs(runs)
    base = named_run(loaded, baseline, "baseline").summary
    return pd.DataFrame([{
        "run": r.name, "method": r.summary.method, "corpus": r.summary.corpus,
        "seed": r.summary.seed, "workers": workers(r), "steps": r.summary.steps,
        "tokens_per_s": r.summary.tokens_per_s, "mean_step_time_s": r.summary.mean_step_time_s,
        "step_time_std_s": (math.nan if r.summary.step_time_std_s is None
                            else r.summary.step_time_std_s),
        "speedup": base.mean_step_time_s / r.summary.mean_step_time_s,
        "throughput_ratio": r.summary.tokens_per_s / base.tokens_per_s, "baseline": baseline,
    } for r in loaded.values()])


def memory_table(runs: Runs, baseline: str) -> pd.DataFrame:
    """Per run: peak resident memory (bytes and GiB = 2**30 bytes) and its ratio to ``baseline``."""
    loaded = load_runs(runs)
    base_peak = named_run(loaded, baseline, "baseline").summary.peak_rss_bytes
    check(base_peak > 0, f"{baseline}: peak_rss_bytes", base_peak, "must be > 0 (a ratio's base)")
    return pd.DataFrame([{
        "run": r.name, "method": r.summary.method, "corpus": r.summary.corpus,
        "seed": r.summary.seed, "peak_rss_bytes": r.summary.peak_rss_bytes,
        "peak_gib": r.summary.peak_rss_bytes / GIB,
        "ratio_vs_baseline": r.summary.peak_rss_bytes / base_peak, "baseline": baseline,
    } for r in loaded.values()])


def bytes_per_step(run: Run) -> dict[str, float] | None:
    """The summary's mean bytes moved per step by kind: the kinds the wings declare
    (:func:`lmrepro.pipeline.registry.byte_kinds`) that it records, in their order, and the
    total; None for a run that records no communication (a single-process run)."""
    b = run.summary.bytes_per_step
    kinds = (*registry.byte_kinds(), TOTAL)
    return {k: float(b[k]) for k in kinds if k in b} if b else None


def _setting_column(run: Run) -> dict[str, Any]:
    """The run's setting under the name its wing gives it (none when it has none)."""
    name = registry.setting(run.role)
    return {} if name is None else {name: run_setting(run)}


def communication_table(runs: Runs, dense: str) -> pd.DataFrame:
    """Per run that communicates: its setting (:func:`~lmrepro.pipeline.runs.run_setting`, under
    its wing's name for it), bytes per step by kind and ``ratio_vs_dense`` = total bytes per
    step over the ``dense`` run's total (runs without communication records are left out)."""
    loaded = load_runs(runs)
    dense_bytes = bytes_per_step(named_run(loaded, dense, "dense"))
    check(dense_bytes is not None and dense_bytes[TOTAL] > 0, "dense", dense,
          "must name a run that records bytes per step (a distributed run)")
    rows = []
    for run in loaded.values():
        b = bytes_per_step(run)
        if b is not None:
            rows.append({"run": run.name, "method": run.summary.method,
                         "corpus": run.summary.corpus, "seed": run.summary.seed,
                         **_setting_column(run), "world_size": run.world_size, **b,
                         "ratio_vs_dense": b[TOTAL] / dense_bytes[TOTAL], "dense": dense})
    return pd.DataFrame(rows)


def bytes_long(runs: Runs) -> pd.DataFrame:
    """Long form ``run, kind, bytes_per_step`` (kinds other than the total) for plotting."""
    rows = []
    for run in load_runs(runs).values():
        b = bytes_per_step(run)
        if b is not None:
            rows += [{"run": run.name, "kind": k, "bytes_per_step": v} for k, v in b.items()
                     if k != TOTAL]
    return pd.DataFrame(rows, columns=["run", "kind", "bytes_per_step"])


def reference_tables(runs: Runs, reference: str, dense: str | None = None
                     ) -> dict[str, pd.DataFrame]:
    """Throughput and memory against the ``reference`` role's run, and communication against the
    ``dense`` role's run, per corpus and seed (the first run of the role in name order); a corpus
    and seed without such a run have no such rows, and a table without rows is left out."""
    loaded = load_runs(runs)
    tables: dict[str, list[pd.DataFrame]] = {"throughput": [], "memory": [], "communication": []}
    for corpus, seed in sorted({(r.summary.corpus, r.summary.seed) for r in loaded.values()}):
        subset = {n: r for n, r in loaded.items()
                  if (r.summary.corpus, r.summary.seed) == (corpus, seed)}
        ref = next((n for n, r in subset.items() if r.role == reference), None)
        if ref is not None:
            tables["throughput"].append(throughput_table(subset, ref))
            tables["memory"].append(memory_table(subset, ref))
        base = next((n for n, r in subset.items() if dense and r.role == dense), None)
        if base is not None:
            tables["communication"].append(communication_table(subset, base))
    return {k: pd.concat(v, ignore_index=True) for k, v in tables.items() if v}


# --------------------------------------------------------------------------------------------
# Timing and memory of configurations, with the spread of the step times
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTimes:
    """A configuration's step time over its runs: the mean of the runs' mean step times and the
    pooled standard deviation of one step's time, ``sqrt(mean of the runs' per-step variances +
    variance of the runs' means)`` (law of total variance; the second term, with ``ddof=1``,
    only with two or more runs). ``spread_s`` is None when a run recorded no spread."""

    mean_s: float
    spread_s: float | None
    n_runs: int


def step_times(means: Sequence[float], stds: Sequence[float | None]) -> StepTimes:
    """:class:`StepTimes` of runs with mean step times ``means`` and per-step standard
    deviations ``stds`` (pure)."""
    check(len(means) == len(stds) and len(means) >= 1, "means", list(means),
          "must give one mean step time per run (at least one) and as many stds")
    mean = float(sum(means) / len(means))
    if any(s is None for s in stds):
        return StepTimes(mean, None, len(means))
    within = sum(float(s) ** 2 for s in stds if s is not None) / len(stds)
    between = (sum((m - mean) ** 2 for m in means) / (len(means) - 1)) if len(means) > 1 else 0.0
    return StepTimes(mean, math.sqrt(within + between), len(means))


def relative_spread(candidate: StepTimes, baseline: StepTimes) -> float | None:
    """``rho = sqrt((s_c / m_c)^2 + (s_b / m_b)^2)``: the combined relative spread of two
    configurations' step times (None when either has none)."""
    if candidate.spread_s is None or baseline.spread_s is None:
        return None
    return math.hypot(candidate.spread_s / candidate.mean_s, baseline.spread_s / baseline.mean_s)


#: the two-sided confidence of a timing ratio's run-level interval
TIMING_CONFIDENCE = 0.95
#: the caveat of a conclusive run-level interval: its seeds ran in one session
ONE_SESSION_CAVEAT = ("the timing interval covers seeds run one after another on one machine, "
                      "not a change of the machine's state between sessions")


def run_halfwidth(log_ratios: Sequence[float], confidence: float = TIMING_CONFIDENCE
                  ) -> float | None:
    """Half-width ``t_{G-1} s / sqrt(G)`` of the two-sided t interval of the mean of G per-seed
    log ratios (None with fewer than two): the run-level spread of a timing ratio (pure)."""
    if len(log_ratios) < 2:
        return None
    low, high = t_bounds(log_ratios, 0.5 + confidence / 2)   # the seed-level test's t bounds
    return (high - low) / 2


def timing_interval(ratio: float, rho: float | None) -> tuple[float, float, bool]:
    """``(low, high, conclusive)`` of a timing ratio: ``ratio * exp(-+rho)``, conclusive iff the
    interval excludes 1, i.e. ``|ln ratio| > rho`` (never without a spread). ``rho``: the
    run-level half-width (:func:`run_halfwidth`), or with one run a side the step-time spread
    (:func:`relative_spread`; ``docs/statistics.md``)."""
    if rho is None:
        return math.nan, math.nan, False
    return ratio * math.exp(-rho), ratio * math.exp(rho), abs(math.log(ratio)) > rho


def resource_caveats(cands: Sequence[Run], bases: Sequence[Run], cores: int | None,
                     rho: float | None, speedup: float, run_level: float | None = None
                     ) -> list[str]:
    """Caveats of a timing or memory comparison: oversubscribed runs (more threads than the
    machine's cores), a difference inside the run-level interval (``run_level``: its
    half-width, with two or more seeds) or, with one run a side, inside the step-time spread
    ``rho`` or with no spread recorded."""
    out = []
    if cores is not None:
        over = sorted({f"{config_label(r)} ({r.summary.threads} threads)"
                       for r in (*cands, *bases) if r.summary.threads > cores})
        if over:
            out.append(f"oversubscribed: {' and '.join(over)} on {cores} cores: throughput not "
                       "representative")
    if run_level is not None:
        if abs(math.log(speedup)) <= run_level:
            low, high, _ = timing_interval(speedup, run_level)
            out.append(f"timing difference inside its run-level 95 % interval over "
                       f"{len(cands)} seeds ({low:.3g}x to {high:.3g}x)")
        else:
            out.append(ONE_SESSION_CAVEAT)
    elif rho is None:
        out.append("no step-time spread recorded: timing verdict inconclusive")
    elif abs(math.log(speedup)) <= rho:
        out.append(f"timing difference inside the step-time spread (±{rho:.0%}; one run a "
                   "side: no run-level spread)")
    else:
        out.append("one run a side: timing judged on the step-time spread, not on run-to-run "
                   "variation")
    return out


def _mean_or_none(values: Sequence[int | None]) -> float | None:
    """The mean of ``values``, or None when any is missing."""
    return None if any(v is None for v in values) else sum(values) / len(values)  # type: ignore


@dataclass(frozen=True)
class SeedThroughputs:
    """A pairing's timing as the timing history records and pools it: the suite's key and
    identity (:func:`~lmrepro.pipeline.runs.suite_identity`), the seeds and each side's
    tokens/s per seed (paired by seed)."""

    suite: str
    identity: dict[str, Any]
    seeds: list[int]
    candidate: list[float]
    baseline: list[float]

    @property
    def ratios(self) -> list[float]:
        """Candidate over baseline tokens/s, per seed."""
        return [x / y for x, y in zip(self.candidate, self.baseline, strict=True)]


def seed_throughputs(cands: Sequence[Run], bases: Sequence[Run]) -> SeedThroughputs:
    """The :class:`SeedThroughputs` of candidate runs against baseline runs paired by seed."""
    identity = suite_identity(cands[0].summary, bases[0].summary)
    return SeedThroughputs(suite=suite_key(identity), identity=identity,
                           seeds=[r.summary.seed for r in cands],
                           candidate=[r.summary.tokens_per_s for r in cands],
                           baseline=[r.summary.tokens_per_s for r in bases])


def resource_comparisons(runs: Runs, cores: int | None = None,
                         machine: Machine | None = None) -> list[ResourceRecord]:
    """Speed and memory of each configuration pair of
    :func:`~lmrepro.pipeline.registry.pairings` (same setting, runs paired by seed),
    averaged over seeds, with the timing spread, the suite's identity and the per-seed
    throughput ratios (what the timing history pools); ``cores``: the machine's cores (None: no
    oversubscription check); ``machine``: where the runs ran (None: unknown)."""
    out = []
    for pairing in pairings(runs):
        bases, cands = pairing.bases, pairing.cands
        c_t = step_times([r.summary.mean_step_time_s for r in cands],
                         [r.summary.step_time_std_s for r in cands])
        b_t = step_times([r.summary.mean_step_time_s for r in bases],
                         [r.summary.step_time_std_s for r in bases])
        rho = relative_spread(c_t, b_t)
        c_tps = sum(r.summary.tokens_per_s for r in cands) / len(cands)
        b_tps = sum(r.summary.tokens_per_s for r in bases) / len(bases)
        c_rss = sum(r.summary.peak_rss_bytes for r in cands) / len(cands)
        b_rss = sum(r.summary.peak_rss_bytes for r in bases) / len(bases)
        c_pss, b_pss = _mean_or_none([r.summary.peak_pss_bytes for r in cands]), \
            _mean_or_none([r.summary.peak_pss_bytes for r in bases])
        c_steps, b_steps = cands[0].summary.steps, bases[0].summary.steps
        speedup = b_t.mean_s / c_t.mean_s
        throughput = c_tps / b_tps
        wall = (c_steps * c_t.mean_s) / (b_steps * b_t.mean_s)
        h = run_halfwidths(cands, bases)
        timed = seed_throughputs(cands, bases)
        c, b = cands[0], bases[0]
        out.append(ResourceRecord(
            label=pairing.label, corpus=c.summary.corpus, candidate_role=c.role,
            baseline_role=b.role, candidate_configuration=pairing.cand_label,
            baseline_configuration=pairing.base_label, candidate_runs=[r.name for r in cands],
            baseline_runs=[r.name for r in bases], setting=run_setting(c),
            candidate_step_time_s=c_t.mean_s, baseline_step_time_s=b_t.mean_s,
            candidate_step_time_spread_s=c_t.spread_s, baseline_step_time_spread_s=b_t.spread_s,
            candidate_steps=c_steps, baseline_steps=b_steps, candidate_tokens_per_s=c_tps,
            baseline_tokens_per_s=b_tps, candidate_threads=c.summary.threads,
            baseline_threads=b.summary.threads, candidate_processes=c.summary.processes,
            baseline_processes=b.summary.processes, candidate_peak_rss_bytes=c_rss,
            baseline_peak_rss_bytes=b_rss, candidate_peak_pss_bytes=c_pss,
            baseline_peak_pss_bytes=b_pss, speedup=speedup, throughput_ratio=throughput,
            wall_ratio=wall, memory_ratio=c_rss / b_rss if b_rss > 0 else None,
            pss_ratio=c_pss / b_pss if c_pss and b_pss else None,
            relative_spread=rho, timing_pairs=len(cands),
            timing_basis="runs" if h["speedup"] is not None else "steps",
            speedup_halfwidth=h["speedup"], throughput_halfwidth=h["throughput"],
            wall_halfwidth=h["wall"],
            speedup_conclusive=_conclusive(speedup, h["speedup"], rho),
            throughput_conclusive=_conclusive(throughput, h["throughput"], rho),
            wall_conclusive=_conclusive(wall, h["wall"], rho),
            caveats=resource_caveats(cands, bases, cores, rho, speedup, h["speedup"]),
            suite=timed.suite, timing_seeds=timed.seeds, throughput_ratios=timed.ratios,
            machine=machine))
    return out


def _conclusive(ratio: float, run_level: float | None, rho: float | None) -> bool:
    """The run-level interval decides; with one run a side, the step-time spread."""
    return timing_interval(ratio, run_level if run_level is not None else rho)[2]


def run_halfwidths(cands: Sequence[Run], bases: Sequence[Run]) -> dict[str, float | None]:
    """The run-level half-widths (:func:`run_halfwidth`) of the speed-up, throughput and
    wall-clock ratios from the per-seed ratios of runs paired by seed (None with one pair)."""
    pairs = list(zip(cands, bases, strict=True))
    speed = [math.log(b.summary.mean_step_time_s / c.summary.mean_step_time_s)
             for c, b in pairs]
    tput = [math.log(c.summary.tokens_per_s / b.summary.tokens_per_s) for c, b in pairs]
    wall = [math.log(c.summary.steps * c.summary.mean_step_time_s
                     / (b.summary.steps * b.summary.mean_step_time_s)) for c, b in pairs]
    return {"speedup": run_halfwidth(speed), "throughput": run_halfwidth(tput),
            "wall": run_halfwidth(wall)}


def _interval_text(r: ResourceRecord) -> str:
    """The speed-up's run-level 95 % interval, or why there is none."""
    if r.speedup_halfwidth is None:
        return "one seed: none"
    low, high, _ = timing_interval(r.speedup, r.speedup_halfwidth)
    return f"{low:.3g}x to {high:.3g}x"


def resources_table(records: Sequence[ResourceRecord]) -> pd.DataFrame:
    """Per configuration pair: mean step times and their spreads, the speed-up, throughput,
    wall-clock and memory ratios, whether the timing is conclusive, and the caveats."""
    columns = ["comparison", "corpus", "seeds", "candidate_step_time_s",
               "candidate_step_time_spread_s", "baseline_step_time_s",
               "baseline_step_time_spread_s", "speedup", "throughput_ratio", "wall_ratio",
               "relative_spread", "speedup_interval", "timing", "memory_ratio", "caveats"]
    nan = float("nan")
    rows = [{"comparison": r.label, "corpus": r.corpus, "seeds": len(r.candidate_runs),
             "candidate_step_time_s": r.candidate_step_time_s,
             "candidate_step_time_spread_s": (nan if r.candidate_step_time_spread_s is None
                                              else r.candidate_step_time_spread_s),
             "baseline_step_time_s": r.baseline_step_time_s,
             "baseline_step_time_spread_s": (nan if r.baseline_step_time_spread_s is None
                                             else r.baseline_step_time_spread_s),
             "speedup": r.speedup, "throughput_ratio": r.throughput_ratio,
             "wall_ratio": r.wall_ratio,
             "relative_spread": nan if r.relative_spread is None else r.relative_spread,
             "speedup_interval": _interval_text(r),
             "timing": ("conclusive" if r.speedup_conclusive else "inconclusive")
             + (f" ({r.timing_pairs} seeds)" if r.timing_basis == "runs"
                else " (step-time spread, one seed)"),
             "memory_ratio": nan if r.memory_ratio is None else r.memory_ratio,
             "caveats": "; ".join(r.caveats)}
            for r in records]
    return pd.DataFrame(rows, columns=columns)


#: a timing verdict needs runs of at least this many steps a side (a few steps time the
#: start-up, not the method)
MIN_TIMED_STEPS = 50


def timing_untestable(r: ResourceRecord) -> str | None:
    """Why a timing comparison cannot test a timing claim (None: it can): runs shorter than
    :data:`MIN_TIMED_STEPS` steps, or no spread to judge the difference by."""
    steps = min(r.candidate_steps, r.baseline_steps)
    if steps < MIN_TIMED_STEPS:
        return (f"runs of {steps} steps are too short to be timed (a timing verdict needs "
                f"runs of at least {MIN_TIMED_STEPS} steps a side)")
    if r.timing_basis == "steps" and r.relative_spread is None:
        return "no step-time spread recorded (a timing verdict needs one)"
    return None
