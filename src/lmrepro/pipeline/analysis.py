"""The analysis of a training stage: its tables, the non-inferiority tests and ``analysis.json``.

Every function takes ``runs``: a mapping ``run name -> run directory`` (or an already loaded
:class:`Run`) in the layout of :mod:`lmrepro.results`; every figure is computed from those runs.
:func:`analysis_stage` writes a stage's tables, its DVC metric and :class:`AnalysisRecords`
(``analysis.json``): everything the claims stage (:mod:`lmrepro.pipeline.claims`) needs, so it
reads figures instead of recomputing them.

Roles. Comparisons and claims need to know what a run is: its role is a pure function of the
summary's ``method`` (:class:`lmrepro.results.Method`) and, for RGC runs, its ``executor``
(:func:`run_role`). Baselines are picked by role, never by run name, so renaming a run changes no
table.

Seeds. Runs whose configuration differs only in the seed are replicates of one configuration
(:func:`configuration_key`); a comparison pairs a candidate configuration's runs with the
baseline configuration's runs of the same seed, and the per-batch losses by (seed, evaluation
batch), so the test reports a batch-level and a seed-level bound (:mod:`lmrepro.stats`).

Timing. A timing comparison (:class:`ResourceRecord`) carries its spread: the standard deviation
of a step's time in each configuration, pooled over its runs (the within-run spread the summaries
record, plus the run-to-run spread of the mean when there are several seeds); a ratio inside that
spread is inconclusive (:func:`timing_interval`, ``docs/statistics.md``).

Units. Eval losses are in nats; bits per byte is ``loss / ln 2``, so the relative difference
``(candidate - baseline) / baseline`` of the non-inferiority test is the same in both.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from lmrepro.errors import ParameterError, check
from lmrepro.io import atomic_write_json, atomic_write_text, read_json, read_jsonl
from lmrepro.results import (BYTE_KINDS, EVAL_LOSSES, EVAL_LOSSES_TEST, METRICS, SUMMARY,
                             Method, RunSummary,
                             collect_runs, read_summary)
from lmrepro.pipeline.provenance import usable_cores as available_cores
from lmrepro.stats import NonInferiorityResult, StatsConfig, noninferiority

GIB = float(1 << 30)
UNITS_NOTE = ("mean_rel_diff and the bounds are fractions of the baseline loss (0.01 = 1 %); "
              "bits per byte = nats / ln 2, so they are the same in nats and in bits per byte")
ANALYSIS_FORMAT = "lmrepro.analysis/2"
DEFAULT_STATS = StatsConfig()  # the design's test: 1 % margin, 95 %, 10 000 resamples, seed 0

ROLE_ADAMW = "adamw"
ROLE_ADAMS = "adams"
ROLE_SCAPE = "scape"
ROLE_TOPK = "topk"                  # top-k with error feedback on AdamS (the paper's foil)
ROLE_SCAPE_STALE_M = "scape_stale_m"  # SCAPE with the stale-|m| mask rule (our ablation)
ROLE_TOPK_ADAMW = "topk_adamw"      # top-k with error feedback on AdamW
ROLE_BACKPROP = "backprop"
ROLE_RGC_ASYNC = "rgc_async"
ROLE_RGC_SYNC = "rgc_sync"
# roles whose processes are data-parallel replicas (their count is the world size)
SPARSE = (ROLE_SCAPE, ROLE_SCAPE_STALE_M, ROLE_TOPK, ROLE_TOPK_ADAMW)
DATA_PARALLEL = (ROLE_ADAMW, ROLE_ADAMS, *SPARSE)
_RGC_ROLES = {"async": ROLE_RGC_ASYNC, "sync": ROLE_RGC_SYNC}

# Which candidate roles are judged against which baseline roles (docs/statistics.md:
# "The same test judges SCAPE vs dense AdamW/AdamS and RGC vs global backprop").
DEFAULT_PAIRINGS: tuple[tuple[str, str], ...] = (
    (ROLE_SCAPE, ROLE_ADAMW), (ROLE_SCAPE, ROLE_ADAMS),
    (ROLE_SCAPE_STALE_M, ROLE_ADAMW), (ROLE_SCAPE_STALE_M, ROLE_ADAMS),
    (ROLE_TOPK, ROLE_ADAMW), (ROLE_TOPK, ROLE_ADAMS), (ROLE_TOPK_ADAMW, ROLE_ADAMW),
    (ROLE_RGC_ASYNC, ROLE_BACKPROP), (ROLE_RGC_SYNC, ROLE_BACKPROP),
)
# The reference roles of each stage's tables: (throughput and memory, communication).
STAGE_REFERENCES: dict[str, tuple[str, str | None]] = {
    "scape": (ROLE_ADAMW, ROLE_ADAMS), "rgc": (ROLE_BACKPROP, None)}


def run_role(method: Method | str, executor: str | None = None, where: str = "") -> str:
    """The role of a run: its ``method``, except that RGC splits by ``executor`` into
    ``rgc_async`` / ``rgc_sync``. An unknown method, an RGC run without an async/sync executor or
    another method with an executor other than its own is refused (``where`` prefixes the
    names in the message, e.g. the summary's path)."""
    try:
        m = Method(method)
    except ValueError:
        raise ParameterError(f"{where}method", method, "must be one of "
                             f"{[x.value for x in Method]} (lmrepro.results.Method)") from None
    if m is Method.RGC:
        check(executor in _RGC_ROLES, f"{where}executor", executor,
              f"must be one of {sorted(_RGC_ROLES)} for an RGC run")
        return _RGC_ROLES[executor]
    allowed = (None, "backprop") if m is Method.BACKPROP else (None,)
    check(executor in allowed, f"{where}executor", executor,
          f"must be one of {list(allowed)} for method {m.value!r}")
    return m.value


# --------------------------------------------------------------------------------------------
# Loading runs
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One finished run: its validated summary, role, per-batch eval losses and metrics."""

    name: str
    path: Path
    summary: RunSummary
    role: str
    eval_losses: tuple[float, ...]
    eval_meta: dict[str, Any]
    metrics: tuple[dict[str, Any], ...] = field(repr=False)
    test_losses: tuple[float, ...] = ()     # the test split's, where the trainer scored it

    @property
    def world_size(self) -> int | None:
        """Data-parallel workers; None for the RGC suite, whose processes are pipeline stages
        compared at the same core budget."""
        return self.summary.processes if self.role in DATA_PARALLEL else None

    @property
    def configuration(self) -> str:
        """:func:`configuration_key` of this run."""
        return configuration_key(self.summary.config)


def _without_names(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_names(v) for k, v in obj.items() if k not in ("name", "seed")}
    if isinstance(obj, list):
        return [_without_names(v) for v in obj]
    return obj


def configuration_key(config: Mapping[str, Any]) -> str:
    """What makes two runs replicates: their configuration (``RunSummary.config``) without run
    names and seeds, as canonical JSON. Runs of one suite that differ only in the seed share it;
    runs of a learning-rate sweep do not."""
    return json.dumps(_without_names(dict(config)), sort_keys=True, default=str)


RunSource = str | Path | Run
Runs = Mapping[str, RunSource]


def load_run(name: str, source: RunSource) -> Run:
    """Read one run directory (or pass a :class:`Run` through)."""
    if isinstance(source, Run):
        return source
    path = Path(source)
    check(path.is_dir(), f"runs[{name!r}]", str(path), "must be an existing run directory")
    summary = read_summary(path)
    # a diverged run may have written no evaluation (RunSummary.diverged_at_step)
    meta = (read_json(path / EVAL_LOSSES) if (path / EVAL_LOSSES).exists()
            or summary.diverged_at_step is None else {"losses": []})
    test = (tuple(float(x) for x in read_json(path / EVAL_LOSSES_TEST)["losses"])
            if (path / EVAL_LOSSES_TEST).exists() else ())
    return Run(name=name, path=path, summary=summary,
               role=run_role(summary.method, summary.executor, f"{path / SUMMARY}: "),
               eval_losses=tuple(float(x) for x in meta.pop("losses")), eval_meta=meta,
               metrics=tuple(read_jsonl(path / METRICS)), test_losses=test)


def load_runs(runs: Runs) -> dict[str, Run]:
    """``{name: Run}`` for a mapping of run names to run directories (insertion order kept)."""
    check(isinstance(runs, Mapping), "runs", type(runs).__name__,
          "must be a mapping of run name -> run directory")
    return {name: load_run(name, src) for name, src in runs.items()}


def _named(runs: dict[str, Run], name: str, what: str) -> Run:
    check(name in runs, what, name, f"must name one of the runs passed in: {sorted(runs)}")
    return runs[name]


def workers(run: Run) -> str:
    """The compute of a run: data-parallel workers, or the threads of an RGC-suite run."""
    if run.world_size is not None:
        return f"{run.world_size} worker{'s' * (run.world_size != 1)}"
    return f"{run.summary.threads} threads"


def run_scale(run: Run) -> str:
    """The scale a run was measured at: parameters (when counted), model shape (``config.model``,
    or the flat RGC config), steps, corpus and :func:`workers`."""
    s = run.summary
    shape = s.config.get("model", s.config)
    parts = [f"{s.n_params / 1e6:.2f}M params"] if s.n_params else []
    if shape.get("n_layers") is not None and shape.get("d_model") is not None:
        parts.append(f"{shape['n_layers']} layers x d={shape['d_model']}")
    return ", ".join(parts + [f"{s.steps} steps", s.corpus, workers(run)])


# --------------------------------------------------------------------------------------------
# Throughput, memory, communication
# --------------------------------------------------------------------------------------------

def throughput_table(runs: Runs, baseline: str) -> pd.DataFrame:
    """Per run: method, corpus, seed, tokens/s, mean step time (and its per-step standard
    deviation) and the ratios against ``baseline``.

    ``speedup`` is the per-step speedup ``baseline mean_step_time_s / run mean_step_time_s`` (the
    SCAPE "x faster per step"); ``throughput_ratio`` is ``run tokens_per_s / baseline
    tokens_per_s`` (the RGC "x the throughput").
    """
    loaded = load_runs(runs)
    base = _named(loaded, baseline, "baseline").summary
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
    base_peak = _named(loaded, baseline, "baseline").summary.peak_rss_bytes
    check(base_peak > 0, f"{baseline}: peak_rss_bytes", base_peak, "must be > 0 (a ratio's base)")
    return pd.DataFrame([{
        "run": r.name, "method": r.summary.method, "corpus": r.summary.corpus,
        "seed": r.summary.seed, "peak_rss_bytes": r.summary.peak_rss_bytes,
        "peak_gib": r.summary.peak_rss_bytes / GIB,
        "ratio_vs_baseline": r.summary.peak_rss_bytes / base_peak, "baseline": baseline,
    } for r in loaded.values()])


def bytes_per_step(run: Run) -> dict[str, float] | None:
    """The summary's mean bytes moved per step by kind (:data:`lmrepro.results.BYTE_KINDS`);
    None for a run that records no communication (a single-process run)."""
    b = run.summary.bytes_per_step
    return {k: float(b[k]) for k in BYTE_KINDS} if b else None


def communication_table(runs: Runs, dense: str) -> pd.DataFrame:
    """Per run that communicates: bytes per step by kind and ``ratio_vs_dense`` = total bytes per
    step over the ``dense`` run's total (runs without communication records are left out)."""
    loaded = load_runs(runs)
    dense_bytes = bytes_per_step(_named(loaded, dense, "dense"))
    check(dense_bytes is not None and dense_bytes["total"] > 0, "dense", dense,
          "must name a run that records bytes per step (a distributed run)")
    rows = []
    for run in loaded.values():
        b = bytes_per_step(run)
        if b is not None:
            rows.append({"run": run.name, "method": run.summary.method,
                         "corpus": run.summary.corpus, "seed": run.summary.seed,
                         "sparsity": run.summary.sparsity,
                         "world_size": run.world_size, **b,
                         "ratio_vs_dense": b["total"] / dense_bytes["total"], "dense": dense})
    return pd.DataFrame(rows)


def bytes_long(runs: Runs) -> pd.DataFrame:
    """Long form ``run, kind, bytes_per_step`` (kinds other than ``total``) for plotting."""
    rows = []
    for run in load_runs(runs).values():
        b = bytes_per_step(run)
        if b is not None:
            rows += [{"run": run.name, "kind": k, "bytes_per_step": b[k]} for k in BYTE_KINDS[:-1]]
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
# Non-inferiority, timing, and the records of analysis.json
# --------------------------------------------------------------------------------------------

class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunRecord(_Record):
    """One run as the claims see it (``scale``: :func:`run_scale`; ``configuration``: the label
    of the configuration it replicates, e.g. ``scape@90% p=2``)."""

    name: str
    role: str
    method: str
    corpus: str
    seed: int
    sparsity: float | None
    processes: int
    threads: int
    steps: int
    final_bpb: float | None
    diverged_at_step: int | None = None
    final_test_bpb: float | None = None
    loss_spikes: int = 0
    mean_density: float | None = None      # sparse methods: mean fraction sent per step
    tokens_per_s: float
    mean_step_time_s: float
    step_time_std_s: float | None
    peak_rss_bytes: int
    peak_pss_bytes: int | None = None
    scale: str
    configuration: str

    @property
    def world_size(self) -> int | None:
        """As :attr:`Run.world_size`."""
        return self.processes if self.role in DATA_PARALLEL else None


class ComparisonRecord(_Record):
    """One non-inferiority test. Roles, methods, ``sparsity`` and ``processes`` are those of the
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
    sparsity: float | None
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


class ResourceRecord(_Record):
    """Speed and memory of a candidate configuration against a baseline configuration (each the
    mean over its runs, i.e. its seeds), with the timing spread (:func:`timing_interval`).

    ``speedup`` = baseline / candidate mean step time; ``throughput_ratio`` = candidate /
    baseline tokens/s; ``wall_ratio`` = candidate / baseline ``steps x mean step time``;
    ``memory_ratio`` = candidate / baseline peak resident memory (RSS), ``pss_ratio`` the same
    in PSS (shared pages such as the torch libraries counted once over a process tree; None when
    a side recorded no PSS). ``relative_spread`` is the
    combined relative step-time spread ``rho``; a ratio ``x`` is conclusive iff
    ``|ln x| > rho`` (None when a side recorded no spread)."""

    label: str
    corpus: str
    candidate_role: str
    baseline_role: str
    candidate_configuration: str
    baseline_configuration: str
    candidate_runs: list[str]
    baseline_runs: list[str]
    sparsity: float | None
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
    speedup_conclusive: bool
    throughput_conclusive: bool
    wall_conclusive: bool
    caveats: list[str]


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
    """``(role, setting, sparsity, configuration)``: runs with the same key differ only in the
    seed; the setting (corpus, world size) must match to compare."""
    sparsity = None if run.summary.sparsity is None else round(run.summary.sparsity, 6)
    return (run.role, (run.summary.corpus, run.world_size), sparsity, run.configuration)


def learning_rate(run: Run) -> float | None:
    """The peak learning rate in the run's configuration (``settings.lr`` or ``lr``)."""
    config = run.summary.config
    lr = (config.get("settings") or {}).get("lr", config.get("lr"))
    return float(lr) if isinstance(lr, (int, float)) else None


def config_label(run: Run, with_lr: bool = False) -> str:
    """A configuration in words: method, RGC executor, sparsity, data-parallel workers (and the
    learning rate when ``with_lr``: where one method ran at several, e.g. a sweep)."""
    label = run.summary.method
    if run.role in (ROLE_RGC_ASYNC, ROLE_RGC_SYNC):
        label += "-" + run.summary.executor
    if run.role in SPARSE and run.summary.sparsity is not None:
        label += f"@{run.summary.sparsity:.0%}"
    if run.world_size is not None:
        label += f" p={run.world_size}"
    if with_lr and (lr := learning_rate(run)) is not None:
        label += f" lr={lr:g}"
    return label


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
    """Two configurations' runs paired by seed, with their labels (:func:`config_label`, with
    the learning rate where a role, setting and sparsity ran at several configurations)."""

    bases: list[Run]
    cands: list[Run]
    base_label: str
    cand_label: str

    @property
    def label(self) -> str:
        return f"{self.cand_label} vs {self.base_label} ({self.cands[0].summary.corpus})"


def _pairings(runs: Runs) -> list[Pairing]:
    """Every configuration pair of :data:`DEFAULT_PAIRINGS` in the same setting, its runs
    paired by seed."""
    groups = configurations(runs)
    several: dict[tuple, int] = {}
    for key in groups:
        several[key[:3]] = several.get(key[:3], 0) + 1
    out = []
    for cand_role, base_role in DEFAULT_PAIRINGS:
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
    """Comparisons implied by the runs' roles (:data:`DEFAULT_PAIRINGS`), per corpus.

    Runs of one configuration (role, corpus, sparsity, world size and the rest of the
    configuration) that differ only in seed are pooled, paired with the baseline
    configuration's runs of the same seed. A data-parallel candidate is compared with baselines
    of the same world size (RGC-suite runs have none).
    """
    return [Comparison(baseline=tuple(b.name for b in p.bases),
                       candidate=tuple(c.name for c in p.cands), label=p.label)
            for p in _pairings(runs)]


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
        b = _named(loaded, b_name, "comparison.baseline")
        c = _named(loaded, c_name, "comparison.candidate")
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
            baseline_runs=list(comp.baseline), sparsity=c.summary.sparsity,
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


def timing_interval(ratio: float, rho: float | None) -> tuple[float, float, bool]:
    """``(low, high, conclusive)`` of a timing ratio: ``ratio * exp(-+rho)``, conclusive iff the
    interval excludes 1, i.e. ``|ln ratio| > rho`` (never without a spread).

    Why the step-to-step spread and not its standard error: step times are serially correlated
    and a run-to-run shift of the machine's state does not average out within a run, so a
    difference smaller than what two identical runs can show is not one we can stand behind
    (``docs/statistics.md``)."""
    if rho is None:
        return math.nan, math.nan, False
    return ratio * math.exp(-rho), ratio * math.exp(rho), abs(math.log(ratio)) > rho


def resource_caveats(cands: Sequence[Run], bases: Sequence[Run], cores: int | None,
                     rho: float | None, speedup: float) -> list[str]:
    """Caveats of a timing or memory comparison: oversubscribed runs (more threads than the
    machine's cores), a difference inside the spread, no recorded spread."""
    out = []
    if cores is not None:
        over = sorted({f"{config_label(r)} ({r.summary.threads} threads)"
                       for r in (*cands, *bases) if r.summary.threads > cores})
        if over:
            out.append(f"oversubscribed: {' and '.join(over)} on {cores} cores: throughput not "
                       "representative")
    if rho is None:
        out.append("no step-time spread recorded: timing verdict inconclusive")
    elif abs(math.log(speedup)) <= rho:
        out.append(f"timing difference inside the step-time spread (±{rho:.0%})")
    return out


def _mean_or_none(values: Sequence[int | None]) -> float | None:
    """The mean of ``values``, or None when any is missing."""
    return None if any(v is None for v in values) else sum(values) / len(values)  # type: ignore


def resource_comparisons(runs: Runs, cores: int | None = None) -> list[ResourceRecord]:
    """Speed and memory of each configuration pair of :data:`DEFAULT_PAIRINGS` (same setting,
    runs paired by seed), averaged over seeds, with the timing spread; ``cores``: the machine's
    cores (None: no oversubscription check)."""
    out = []
    for pairing in _pairings(runs):
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
        c, b = cands[0], bases[0]
        out.append(ResourceRecord(
            label=pairing.label, corpus=c.summary.corpus, candidate_role=c.role,
            baseline_role=b.role, candidate_configuration=pairing.cand_label,
            baseline_configuration=pairing.base_label, candidate_runs=[r.name for r in cands],
            baseline_runs=[r.name for r in bases], sparsity=c.summary.sparsity,
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
            relative_spread=rho, speedup_conclusive=timing_interval(speedup, rho)[2],
            throughput_conclusive=timing_interval(throughput, rho)[2],
            wall_conclusive=timing_interval(wall, rho)[2],
            caveats=resource_caveats(cands, bases, cores, rho, speedup)))
    return out


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


def resources_table(records: Sequence[ResourceRecord]) -> pd.DataFrame:
    """Per configuration pair: mean step times and their spreads, the speed-up, throughput,
    wall-clock and memory ratios, whether the timing is conclusive, and the caveats."""
    columns = ["comparison", "corpus", "seeds", "candidate_step_time_s",
               "candidate_step_time_spread_s", "baseline_step_time_s",
               "baseline_step_time_spread_s", "speedup", "throughput_ratio", "wall_ratio",
               "relative_spread", "timing", "memory_ratio", "caveats"]
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
             "timing": "conclusive" if r.speedup_conclusive else "inconclusive",
             "memory_ratio": nan if r.memory_ratio is None else r.memory_ratio,
             "caveats": "; ".join(r.caveats)}
            for r in records]
    return pd.DataFrame(rows, columns=columns)


def noninferiority_table(runs: Runs, comparisons: Sequence[ComparisonSpec] | None = None, *,
                         stats: StatsConfig = DEFAULT_STATS) -> pd.DataFrame:
    """:func:`outcomes_table` of :func:`run_comparisons`."""
    return outcomes_table(run_comparisons(runs, comparisons, stats=stats))


def loss_spikes(metrics: Sequence[Mapping[str, Any]], window: int = 50,
                factor: float = 1.5) -> int:
    """Training-loss spikes of a run: logged steps whose loss exceeds ``factor`` times the
    median of the ``window`` logged losses before it (after the first ``window``); a
    non-finite loss counts too. The instability the SCAPE paper attributes to top-k."""
    losses = [float(r["loss"]) for r in metrics if "loss" in r]
    spikes = 0
    for i in range(window, len(losses)):
        ref = float(np.median(losses[i - window:i]))
        if not math.isfinite(losses[i]) or losses[i] > factor * ref:
            spikes += 1
    return spikes


def analysis_records(runs: Runs, *, stage: str = "", stats: StatsConfig = DEFAULT_STATS,
                     outcomes: Sequence[ComparisonOutcome] | None = None,
                     cores: int | None = None,
                     floors: Mapping[str, Mapping[str, Any]] | None = None) -> AnalysisRecords:
    """The records of ``runs``, of ``outcomes`` (default: :func:`run_comparisons` with
    ``stats``; pass the outcomes computed with the same ``stats`` to avoid a second bootstrap)
    and of :func:`resource_comparisons` (``cores``: the machine's, for the oversubscription
    caveat)."""
    loaded = load_runs(runs)
    if outcomes is None:
        outcomes = run_comparisons(loaded, stats=stats, floors=floors)
    keys = set(RunRecord.model_fields) & set(RunSummary.model_fields)
    return AnalysisRecords(
        stage=stage, stats=stats, cores=cores, floors=dict(floors or {}),
        seeds=sorted({r.summary.seed for r in loaded.values()}),
        comparisons=[o.record for o in outcomes],
        resources=resource_comparisons(loaded, cores),
        runs=[RunRecord(name=r.name, role=r.role, scale=run_scale(r),
                        configuration=config_label(r),
                        final_test_bpb=r.summary.details.get("final_test_bpb"),
                        mean_density=r.summary.details.get("mean_density"),
                        loss_spikes=loss_spikes(r.metrics),
                        **r.summary.model_dump(include=keys - {"name"}))
              for r in loaded.values()])


def corpus_floors(prepared_dir: str | Path | None, corpora: set[str]
                  ) -> dict[str, dict[str, Any]]:
    """The n-gram floors (:func:`lmrepro.data.ngram.corpus_floor`) of the prepared corpora
    found under ``prepared_dir`` (none when it is None)."""
    from lmrepro.data.ngram import corpus_floor

    if prepared_dir is None:
        return {}
    return {c: corpus_floor(Path(prepared_dir) / c, write=False) for c in sorted(corpora)
            if (Path(prepared_dir) / c / "manifest.json").exists()}


def read_analysis(path: str | Path) -> AnalysisRecords:
    """A stage's ``analysis.json``, validated (a file of an older format is refused, naming
    the stage to rerun)."""
    data = read_json(path)
    check(isinstance(data, dict) and data.get("format") == ANALYSIS_FORMAT, str(path),
          data.get("format") if isinstance(data, dict) else type(data).__name__,
          f"must be an {ANALYSIS_FORMAT} file: rerun the analysis stage (dvc repro)")
    return AnalysisRecords.model_validate(data)


# --------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------

def analysis_stage(stage: str, stats: StatsConfig, results_root: str | Path = "results",
                   out_root: str | Path = "results/analysis",
                   seeds: Sequence[int] | None = None,
                   prepared_dir: str | Path | None = "data/prepared") -> dict[str, Any]:
    """Throughput, memory, communication, timing and non-inferiority tables of one stage.

    Reads the finished runs under ``results_root/<stage>/runs`` (only those trained with one of
    ``seeds`` when given: the active profile's seeds); tables are computed per corpus and seed
    against that corpus's reference role (:data:`STAGE_REFERENCES`) and written as CSV under
    ``out_root/<stage>/``, with ``noninferiority.json`` (the stage's DVC metric),
    ``analysis.json`` (:class:`AnalysisRecords`, read by the claims stage) and the figures as PNG
    (DVC image plots). The loss curves draw the n-gram floors of the corpora prepared under
    ``prepared_dir`` when given (:func:`lmrepro.pipeline.plots.ngram_floors`). Returns ``runs``,
    ``tables``, ``outcomes``, ``records``, ``figures`` and ``floors``.
    """
    from lmrepro.pipeline import plots

    check(stage in STAGE_REFERENCES, "stage", stage, f"must be one of {sorted(STAGE_REFERENCES)}")
    runs_dir = Path(results_root) / stage / "runs"
    runs = load_runs(collect_runs(runs_dir))
    if seeds is not None:
        runs = {n: r for n, r in runs.items() if r.summary.seed in set(seeds)}
    if not runs:
        raise FileNotFoundError(f"no finished runs under {runs_dir}"
                                + (f" with seeds {list(seeds)}" if seeds is not None else ""))
    out_dir = Path(out_root) / stage
    frames = reference_tables(runs, *STAGE_REFERENCES[stage])
    floors = corpus_floors(prepared_dir, {r.summary.corpus for r in runs.values()})
    outcomes = run_comparisons(runs, stats=stats, floors=floors)
    records = analysis_records(runs, stage=stage, stats=stats, outcomes=outcomes,
                               cores=available_cores(), floors=floors)
    frames["noninferiority"] = outcomes_table(outcomes)
    frames["timing"] = resources_table(records.resources)
    for name, frame in frames.items():
        atomic_write_text(out_dir / f"{name}.csv", frame.to_csv(index=False))
    atomic_write_json(out_dir / "noninferiority.json", {
        c.label: {"mean_rel_diff": c.mean_rel_diff, "upper_bound": c.upper_bound,
                  "batch_upper_bound": c.batch_upper_bound,
                  "seed_upper_bound": c.seed_upper_bound, "level": c.level,
                  "non_inferior": c.non_inferior, "pairs": c.n_pairs, "seeds": c.n_seeds}
        for c in records.comparisons})
    atomic_write_json(out_dir / "analysis.json", records.model_dump(mode="json"))
    floors = ({} if prepared_dir is None else
              plots.ngram_floors(prepared_dir, {r.summary.corpus for r in runs.values()}))
    figures = {"loss_curves": plots.plot_loss_curves(runs, title=f"{stage}: loss curves",
                                                     floors=floors),
               "bootstrap": plots.plot_bootstrap(outcomes)}
    if "communication" in frames:
        figures["bytes_per_step"] = plots.plot_bytes_per_step(runs)
    for name, fig in figures.items():
        plots.save_figure(fig, out_dir / f"{name}.png")
    return {"runs": runs, "tables": frames, "outcomes": outcomes, "records": records,
            "figures": figures, "floors": floors}
