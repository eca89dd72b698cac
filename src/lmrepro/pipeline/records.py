"""The records of ``analysis.json``: what the claims stage (:mod:`lmrepro.pipeline.claims`)
reads of a stage's analysis instead of recomputing it (:class:`AnalysisRecords`), and its reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from lmrepro.errors import check
from lmrepro.io import read_json
from lmrepro.pipeline import registry
from lmrepro.results import details_model
from lmrepro.stats import StatsConfig

ANALYSIS_FORMAT = "lmrepro.analysis/2"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _setting_by_its_name(data: Any) -> Any:
    """A record's setting, where it stands under the name its wing gives it (records written
    before the setting had a name of its own), as ``setting``."""
    if isinstance(data, dict) and "setting" not in data:
        for name in registry.settings():
            if name in data:
                data = {**{k: v for k, v in data.items() if k != name}, "setting": data[name]}
    return data


class _WithSetting(_Record):
    """A record holding a run's ``setting`` (:func:`lmrepro.pipeline.runs.run_setting`)."""

    setting: float | None

    @model_validator(mode="before")
    @classmethod
    def _under_its_name(cls, data: Any) -> Any:
        return _setting_by_its_name(data)


class RunRecord(_WithSetting):
    """One run as the claims see it (``scale``: :func:`~lmrepro.pipeline.runs.run_scale`;
    ``configuration``: the label of the configuration it replicates, e.g. ``scape@90% p=2``)."""

    name: str
    role: str
    method: str
    corpus: str
    seed: int
    processes: int
    threads: int
    steps: int
    final_bpb: float | None
    diverged_at_step: int | None = None
    final_test_bpb: float | None = None
    loss_spikes: int = 0
    tokens_per_s: float
    mean_step_time_s: float
    step_time_std_s: float | None
    peak_rss_bytes: int
    peak_pss_bytes: int | None = None
    scale: str
    configuration: str
    facts: dict[str, Any] = {}    # what its wing keeps of its details (Wing.run_facts)

    @model_validator(mode="before")
    @classmethod
    def _facts_in_their_place(cls, data: Any) -> Any:
        # records written before the facts had a place of their own hold them beside the common
        # fields: read as the details class of the run's method reads them (older names too)
        data = _setting_by_its_name(data)
        if not isinstance(data, dict) or "facts" in data:
            return data
        beside = [k for k in data if k not in cls.model_fields]
        if not beside:
            return data
        read = details_model(data.get("method")).model_validate({k: data[k] for k in beside})
        facts = {k: v for k, v in read.model_dump(exclude_unset=True).items() if v is not None}
        return {**{k: v for k, v in data.items() if k not in beside}, "facts": facts}

    @property
    def world_size(self) -> int | None:
        """As :attr:`lmrepro.pipeline.runs.Run.world_size`."""
        return self.processes if registry.is_data_parallel(self.role) else None


class ComparisonRecord(_WithSetting):
    """One non-inferiority test. Roles, methods, ``setting`` and ``processes`` are those of the
    first runs of each side; runs are paired by seed (``seeds``) and their per-batch losses by
    (seed, evaluation batch). ``upper_bound`` is the bound of the verdict, from ``level``
    (``seed`` with at least ``stats.min_seeds`` seeds, else ``batch``); both bounds are kept.
    The numbers are None and ``bootstrap_method`` is empty when the candidate diverged (``note``
    says where). ``caveats`` are computed here (one seed, too few seeds for the seed level)."""

    label: str
    corpus: str
    candidate_role: str
    baseline_role: str
    candidate_method: str
    baseline_method: str
    candidate_runs: list[str]
    baseline_runs: list[str]
    processes: int
    n_pairs: int
    n_seeds: int
    seeds: list[int]
    mean_rel_diff: float | None
    upper_bound: float | None
    batch_upper_bound: float | None
    seed_upper_bound: float | None
    level: Literal["batch", "seed"]
    margin: float
    confidence: float | None
    non_inferior: bool
    verdict: str
    bootstrap_method: str
    note: str
    caveats: list[str]
    split: Literal["val", "test"] = "val"
    lower_bound: float | None = None
    seed_lower_bound: float | None = None
    p_value: float | None = None
    worse: bool = False
    baseline_bpb: float | None = None        # the baseline runs' mean final bpb on ``split``
    floor_bpb: float | None = None           # the corpus's trigram floor on ``split``
    testable: bool = True                    # baseline_bpb <= (1 - 10 %) floor_bpb
    # how many times the baseline's steps the candidate needs for its final loss, in words
    # (a length study's steps-to-target measure), where the stage that made the record has one
    steps_to_target: str | None = None


class Machine(_Record):
    """The machine a timing was measured on, as the timing history matches sessions: the CPU
    model (:func:`lmrepro.pipeline.provenance.cpu_model`) and the usable cores."""

    cpu_model: str
    cores: int

    def text(self) -> str:
        return f"{self.cpu_model}, {self.cores} core{'s' * (self.cores != 1)}"


class PooledTiming(_Record):
    """A timing ratio pooled over the sessions in which its suite ran on one machine
    (:func:`lmrepro.pipeline.timing_history.pool_sessions`): the geometric mean ``ratio`` of
    the sessions' geometric means and its two-sided ``confidence`` t interval ``[low, high]``
    with the session as the unit (``basis`` "sessions", df = sessions - 1); with one session
    the seed-level interval of its seeds (``basis`` "seeds"; none with one seed). ``seeds``:
    the seeds over all sessions. Conclusive iff the interval excludes 1."""

    ratio: float
    low: float | None
    high: float | None
    sessions: int
    seeds: int
    basis: Literal["sessions", "seeds"]
    confidence: float
    conclusive: bool


class ResourceRecord(_WithSetting):
    """Speed and memory of a candidate configuration against a baseline configuration (each the
    mean over its runs, i.e. its seeds), with the timing spread
    (:func:`~lmrepro.pipeline.resources.timing_interval`).

    ``speedup`` = baseline / candidate mean step time; ``throughput_ratio`` = candidate /
    baseline tokens/s; ``wall_ratio`` = candidate / baseline ``steps x mean step time``;
    ``memory_ratio`` = candidate / baseline peak resident memory (RSS), ``pss_ratio`` the same
    in PSS (shared pages such as the torch libraries counted once over a process tree; None when
    a side recorded no PSS).

    Timing verdicts (``docs/statistics.md``): with runs of two or more seeds on both sides
    (``timing_pairs``, paired by seed; ``timing_basis`` "runs") a ratio ``x`` is conclusive iff
    its run-level 95 % t interval ``x exp(-+h)`` excludes 1, ``h`` the half-width of the
    per-seed log ratios (``speedup_halfwidth``, ``throughput_halfwidth``, ``wall_halfwidth``);
    with one run each (``timing_basis`` "steps") iff ``|ln x| > relative_spread``, the combined
    relative step-time spread ``rho`` (None when a side recorded no spread), and the caveat
    says so. ``pooled_throughput``: the throughput ratio pooled over every recorded session of
    the suite on the same machine (the claims stage sets it from the timing history)."""

    label: str
    corpus: str
    candidate_role: str
    baseline_role: str
    candidate_configuration: str
    baseline_configuration: str
    candidate_runs: list[str]
    baseline_runs: list[str]
    candidate_step_time_s: float
    baseline_step_time_s: float
    candidate_step_time_spread_s: float | None
    baseline_step_time_spread_s: float | None
    candidate_steps: int
    baseline_steps: int
    candidate_tokens_per_s: float
    baseline_tokens_per_s: float
    candidate_threads: int
    baseline_threads: int
    candidate_processes: int
    baseline_processes: int
    candidate_peak_rss_bytes: float
    baseline_peak_rss_bytes: float
    candidate_peak_pss_bytes: float | None
    baseline_peak_pss_bytes: float | None
    speedup: float
    throughput_ratio: float
    wall_ratio: float
    memory_ratio: float | None
    pss_ratio: float | None
    relative_spread: float | None
    timing_pairs: int = 1
    timing_basis: Literal["runs", "steps"] = "steps"
    speedup_halfwidth: float | None = None
    throughput_halfwidth: float | None = None
    wall_halfwidth: float | None = None
    speedup_conclusive: bool
    throughput_conclusive: bool
    wall_conclusive: bool
    caveats: list[str]
    # the timing history (docs/statistics.md, "Pooling the sessions"): the suite's identity
    # key (lmrepro.pipeline.timing_history.suite_key), the seeds of the pairs and each pair's
    # tokens/s ratio, and the machine; records written before the history have none
    suite: str | None = None
    timing_seeds: list[int] = []
    throughput_ratios: list[float] = []
    machine: Machine | None = None
    # set by the claims stage from the history, never written by an analysis
    pooled_throughput: PooledTiming | None = None


class AnalysisRecords(_Record):
    """``analysis.json`` of one stage: its runs, its comparisons (quality and resources), the
    test's settings, the seeds analysed and the cores of the machine it ran on."""

    format: Literal["lmrepro.analysis/2"] = ANALYSIS_FORMAT
    stage: str
    stats: StatsConfig
    seeds: list[int]
    cores: int | None
    runs: list[RunRecord]
    comparisons: list[ComparisonRecord]
    resources: list[ResourceRecord]
    floors: dict[str, dict[str, Any]] = {}   # per corpus: lmrepro.data.ngram.corpus_floor

    def run(self, name: str) -> RunRecord:
        """The run record called ``name``."""
        found = [r for r in self.runs if r.name == name]
        check(len(found) == 1, "run", name, f"must name one run of the {self.stage!r} analysis")
        return found[0]


def read_analysis(path: str | Path) -> AnalysisRecords:
    """A stage's ``analysis.json``, validated (a file of an older format is refused, naming
    the stage to rerun)."""
    data = read_json(path)
    check(isinstance(data, dict) and data.get("format") == ANALYSIS_FORMAT, str(path),
          data.get("format") if isinstance(data, dict) else type(data).__name__,
          f"must be an {ANALYSIS_FORMAT} file: rerun the analysis stage (dvc repro)")
    return AnalysisRecords.model_validate(data)
