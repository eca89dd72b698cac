"""The timing history: every session in which a timed suite has run, so that a timing verdict
pools the sessions instead of resting on one session's seeds (docs/statistics.md, "Pooling the
sessions").

A session is one publication of a profile (``lmrepro publish``): its runs, trained one after
another on one machine. The history file (:data:`HISTORY_FILE`, committed beside the published
profiles) holds one :class:`HistoryEntry` per session and timed pairing
(:func:`lmrepro.pipeline.registry.timed_pairings`): the suite's identity (its key; the identity
itself, :func:`lmrepro.pipeline.runs.suite_identity`, once under ``suites``), the machine, the
publication's profile, commit and date, the seeds and each role's tokens/s with their ratio,
paired by seed. :func:`record_profile` adds a published profile's entries (``lmrepro publish``
calls it): an entry of the same runs, or of the same profile, commit and suite, is replaced,
never repeated.

The claims stage pools (:func:`pool_records`): a record's sessions are the entries of its suite
and machine, and the record's own runs as one more session where the history does not hold
them yet; :func:`pool_sessions` gives the ratio and its t interval with the session as the unit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from lmrepro.errors import check
from lmrepro.io import atomic_write_json, read_json
from lmrepro.pipeline import registry
from lmrepro.pipeline.comparisons import pairings
from lmrepro.pipeline.records import AnalysisRecords, Machine, PooledTiming, ResourceRecord
from lmrepro.pipeline.resources import TIMING_CONFIDENCE, seed_throughputs
from lmrepro.pipeline.runs import load_runs
from lmrepro.rundirs import collect_runs
from lmrepro.stats import t_bounds

HISTORY_FORMAT: Final = "lmrepro.timing_history/1"
#: the history's file name, beside the published profiles
HISTORY_NAME = "timing_history.json"
#: where the pipeline reads it, relative to the project root (the stages' working directory)
HISTORY_FILE = Path("published") / HISTORY_NAME
#: two measurements of the same runs agree to this relative tolerance (JSON keeps floats exact)
SAME_RUNS_RTOL = 1e-12


class HistoryEntry(BaseModel):
    """One session of one timed pairing: per seed (``seeds``, paired by seed) each role's
    tokens/s and their ratio, candidate over baseline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str
    commit: str | None
    dirty: bool | None
    date: str | None
    machine: Machine
    stage: str
    label: str
    corpus: str
    candidate_role: str
    baseline_role: str
    suite: str
    seeds: list[int]
    candidate_tokens_per_s: list[float]
    baseline_tokens_per_s: list[float]
    throughput_ratios: list[float]

    @model_validator(mode="after")
    def _paired(self) -> HistoryEntry:
        n = len(self.seeds)
        if n == 0 or {len(self.candidate_tokens_per_s), len(self.baseline_tokens_per_s),
                      len(self.throughput_ratios)} != {n}:
            raise ValueError(f"entry {self.profile}/{self.label}: seeds, tokens/s and ratios "
                             f"must be as many (at least one): {self.seeds}")
        if not all(math.isfinite(x) and x > 0 for x in self.throughput_ratios):
            raise ValueError(f"entry {self.profile}/{self.label}: throughput_ratios "
                             f"{self.throughput_ratios} must be finite and > 0")
        return self


class TimingHistory(BaseModel):
    """The history file: the suites' identities by key, and the entries (oldest first)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["lmrepro.timing_history/1"] = HISTORY_FORMAT
    suites: dict[str, dict[str, Any]] = {}
    entries: list[HistoryEntry] = []


# --------------------------------------------------------------------------------------------
# Pooling (pure)
# --------------------------------------------------------------------------------------------

def pool_sessions(sessions: Sequence[Sequence[float]],
                  confidence: float = TIMING_CONFIDENCE) -> PooledTiming:
    """A timing ratio pooled over ``sessions`` (each: its per-seed ratios), the session as the
    unit: each session's mean log ratio, their mean back-transformed (a geometric mean) and the
    two-sided ``confidence`` t interval of it, df = sessions - 1. With one session, the
    seed-level t interval of its log ratios (none with one seed). Conclusive iff the interval
    excludes 1."""
    check(0 < confidence < 1, "confidence", confidence, "must lie in (0, 1)")
    check(len(sessions) > 0 and all(len(s) > 0 for s in sessions), "sessions",
          [list(s) for s in sessions], "must hold at least one session of at least one ratio")
    check(all(math.isfinite(x) and x > 0 for s in sessions for x in s), "sessions",
          [list(s) for s in sessions], "must hold finite ratios > 0")
    logs = [[math.log(x) for x in s] for s in sessions]
    means = [sum(s) / len(s) for s in logs]
    units = means if len(means) >= 2 else logs[0]
    centre = sum(units) / len(units)
    low = high = None
    if len(units) >= 2:
        lo, hi = t_bounds(units, 0.5 + confidence / 2)
        low, high = math.exp(lo), math.exp(hi)
    return PooledTiming(ratio=math.exp(centre), low=low, high=high, sessions=len(sessions),
                        seeds=sum(len(s) for s in sessions),
                        basis="sessions" if len(means) >= 2 else "seeds", confidence=confidence,
                        conclusive=low is not None and high is not None
                        and (low > 1 or high < 1))


def _same_ratios(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=SAME_RUNS_RTOL)
                                    for x, y in zip(a, b))


def same_runs(entry: HistoryEntry, suite: str, seeds: Sequence[int],
              ratios: Sequence[float]) -> bool:
    """Whether ``entry`` records these runs: the same suite, seeds and per-seed ratios."""
    return entry.suite == suite and entry.seeds == list(seeds) \
        and _same_ratios(entry.throughput_ratios, ratios)


def sessions_of(record: ResourceRecord, history: TimingHistory) -> list[list[float]]:
    """The per-seed throughput ratios of every session of ``record``'s suite and pairing on its
    machine: the history's, then the record's own unless the history holds them (pure)."""
    found = [e for e in history.entries
             if e.suite == record.suite and e.machine == record.machine
             and (e.candidate_role, e.baseline_role) == (record.candidate_role,
                                                         record.baseline_role)]
    out = [list(e.throughput_ratios) for e in found]
    if not any(same_runs(e, record.suite or "", record.timing_seeds, record.throughput_ratios)
               for e in found):
        out.append(list(record.throughput_ratios))
    return out


def timed_on(record: ResourceRecord, history: TimingHistory) -> Machine | None:
    """The machine that timed ``record``'s runs: that of a history entry holding the same runs
    (runs reused from an earlier publication were timed there, not on the machine analysing
    them now), else the record's own (pure)."""
    for e in history.entries:
        if (e.candidate_role, e.baseline_role) == (record.candidate_role, record.baseline_role) \
                and same_runs(e, record.suite or "", record.timing_seeds,
                              record.throughput_ratios):
            return e.machine
    return record.machine


def pool_records(records: AnalysisRecords, history: TimingHistory,
                 confidence: float = TIMING_CONFIDENCE) -> AnalysisRecords:
    """``records`` with ``pooled_throughput`` set on each timed pairing's record that knows its
    suite, machine and per-seed ratios (:func:`sessions_of`, :func:`pool_sessions`), its machine
    the one that timed its runs (:func:`timed_on`); a record written before the history is left
    as it is (pure)."""
    timed = set(registry.timed_pairings())

    def pooled(r: ResourceRecord) -> ResourceRecord:
        if (r.candidate_role, r.baseline_role) not in timed or r.suite is None \
                or r.machine is None or not r.throughput_ratios:
            return r
        r = r.model_copy(update={"machine": timed_on(r, history)})
        return r.model_copy(update={
            "pooled_throughput": pool_sessions(sessions_of(r, history), confidence)})

    return records.model_copy(update={"resources": [pooled(r) for r in records.resources]})


# --------------------------------------------------------------------------------------------
# Entries of a published profile, and the file
# --------------------------------------------------------------------------------------------

def profile_entries(profile_dir: str | os.PathLike) -> TimingHistory:
    """The entries of a published profile (``published/<profile>``: its provenance, parameters
    and run summaries): one per timed pairing of each analysis stage's runs, with the suites'
    identities."""
    folder = Path(profile_dir)
    check(all((folder / f).is_file() for f in ("reports/provenance.json", "results/params.json")),
          "profile_dir", str(folder), "must be a published profile (published/<profile>) holding "
          "reports/provenance.json and results/params.json")
    prov = read_json(folder / "reports" / "provenance.json")
    machine = prov.get("machine") or {}
    cores = machine.get("usable_cores") or machine.get("cpu_count")
    check(bool(machine.get("cpu_model")) and isinstance(cores, int), "provenance",
          str(folder / "reports" / "provenance.json"),
          "must record the machine's cpu_model and usable_cores")
    where = Machine(cpu_model=machine["cpu_model"], cores=cores)
    git = prov.get("git") or {}
    profile = str(read_json(folder / "results" / "params.json").get("profile", "default"))
    timed = set(registry.timed_pairings())
    suites: dict[str, dict[str, Any]] = {}
    entries = []
    for stage in registry.stages():
        runs = collect_runs(folder / "results" / stage / "runs")
        for p in pairings(load_runs(runs)) if runs else []:
            c, b = p.cands[0], p.bases[0]
            if (c.role, b.role) not in timed:
                continue
            seeds = seed_throughputs(p.cands, p.bases)
            suites[seeds.suite] = seeds.identity
            entries.append(HistoryEntry(
                profile=profile, commit=git.get("commit"), dirty=git.get("dirty"),
                date=prov.get("generated_at"), machine=where, stage=stage, label=p.label,
                corpus=c.summary.corpus, candidate_role=c.role, baseline_role=b.role,
                suite=seeds.suite, seeds=seeds.seeds, candidate_tokens_per_s=seeds.candidate,
                baseline_tokens_per_s=seeds.baseline, throughput_ratios=seeds.ratios))
    return TimingHistory(suites=suites, entries=entries)


def _replaces(new: HistoryEntry, old: HistoryEntry) -> bool:
    """The same session: the same runs, or the same profile, commit and suite republished."""
    return (new.profile, new.commit, new.suite) == (old.profile, old.commit, old.suite) \
        or (same_runs(old, new.suite, new.seeds, new.throughput_ratios)
            and _same_ratios(old.candidate_tokens_per_s, new.candidate_tokens_per_s))


def _timed_when(new: HistoryEntry, history: TimingHistory) -> HistoryEntry:
    """``new`` with the commit, date and machine of the session that timed its runs: an entry of
    ``history`` holding the same runs and tokens/s (a republication that reused the runs timed
    nothing); ``new`` itself otherwise."""
    for old in history.entries:
        if same_runs(old, new.suite, new.seeds, new.throughput_ratios) \
                and _same_ratios(old.candidate_tokens_per_s, new.candidate_tokens_per_s):
            return new.model_copy(update={"commit": old.commit, "dirty": old.dirty,
                                          "date": old.date, "machine": old.machine})
    return new


def merged(history: TimingHistory, new: TimingHistory) -> TimingHistory:
    """``history`` with ``new``'s entries, each replacing the entries of its session
    (:func:`_replaces`) and dated as the session that timed its runs (:func:`_timed_when`):
    idempotent; entries ordered by date, suites kept while used (pure)."""
    fresh = [_timed_when(n, history) for n in new.entries]
    kept = [e for e in history.entries if not any(_replaces(n, e) for n in fresh)]
    entries = sorted([*kept, *fresh], key=lambda e: (e.date or "", e.profile, e.label))
    used = {e.suite for e in entries}
    suites = {k: v for k, v in sorted({**history.suites, **new.suites}.items()) if k in used}
    return TimingHistory(suites=suites, entries=entries)


def read_history(path: str | os.PathLike = HISTORY_FILE) -> TimingHistory:
    """The history file at ``path`` (an empty history where there is none)."""
    path = Path(path)
    if not path.exists():
        return TimingHistory()
    data = read_json(path)
    found = data.get("format") if isinstance(data, dict) else type(data).__name__
    check(found == HISTORY_FORMAT, str(path), found, f"must be a {HISTORY_FORMAT} file")
    return TimingHistory.model_validate(data)


def record_profile(profile_dir: str | os.PathLike,
                   history_path: str | os.PathLike = HISTORY_FILE) -> TimingHistory:
    """Add the published profile's entries (:func:`profile_entries`) to the history file at
    ``history_path`` (:func:`merged`: republishing replaces, never repeats); the file is
    written only when that changes it. Returns the profile's entries."""
    new = profile_entries(profile_dir)
    history = read_history(history_path)
    updated = merged(history, new)
    if updated != history:
        atomic_write_json(history_path, updated.model_dump(mode="json"))
    return new
