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

Units. Eval losses are in nats; bits per byte is ``loss / ln 2``, so the relative difference
``(candidate - baseline) / baseline`` of the non-inferiority test is the same in both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict

from lmrepro.errors import ParameterError, check
from lmrepro.io import atomic_write_json, atomic_write_text, read_json, read_jsonl
from lmrepro.results import (BYTE_KINDS, EVAL_LOSSES, METRICS, SUMMARY, Method, RunSummary,
                             collect_runs, read_summary)
from lmrepro.stats import NonInferiorityResult, StatsConfig, noninferiority

GIB = float(1 << 30)
UNITS_NOTE = ("mean_rel_diff and upper_bound are fractions of the baseline loss (0.01 = 1 %); "
              "bits per byte = nats / ln 2, so they are the same in nats and in bits per byte")
ANALYSIS_FORMAT = "lmrepro.analysis/1"
DEFAULT_STATS = StatsConfig()  # the design's test: 1 % margin, 95 %, 10 000 resamples, seed 0

ROLE_ADAMW = "adamw"
ROLE_ADAMS = "adams"
ROLE_SCAPE = "scape"
ROLE_TOPK = "topk"
ROLE_BACKPROP = "backprop"
ROLE_RGC_ASYNC = "rgc_async"
ROLE_RGC_SYNC = "rgc_sync"
# roles whose processes are data-parallel replicas (their count is the world size)
DATA_PARALLEL = (ROLE_ADAMW, ROLE_ADAMS, ROLE_SCAPE, ROLE_TOPK)
_RGC_ROLES = {"async": ROLE_RGC_ASYNC, "sync": ROLE_RGC_SYNC}

# Which candidate roles are judged against which baseline roles (DESIGN.md, "Non-inferiority":
# "The same test judges SCAPE vs dense AdamW/AdamS and RGC vs global backprop").
DEFAULT_PAIRINGS: tuple[tuple[str, str], ...] = (
    (ROLE_SCAPE, ROLE_ADAMW), (ROLE_SCAPE, ROLE_ADAMS),
    (ROLE_TOPK, ROLE_ADAMW), (ROLE_TOPK, ROLE_ADAMS),
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

    @property
    def world_size(self) -> int | None:
        """Data-parallel workers; None for the RGC suite, whose processes are pipeline stages
        compared at the same core budget."""
        return self.summary.processes if self.role in DATA_PARALLEL else None


RunSource = str | Path | Run
Runs = Mapping[str, RunSource]


def load_run(name: str, source: RunSource) -> Run:
    """Read one run directory (or pass a :class:`Run` through)."""
    if isinstance(source, Run):
        return source
    path = Path(source)
    check(path.is_dir(), f"runs[{name!r}]", str(path), "must be an existing run directory")
    summary = read_summary(path)
    meta = read_json(path / EVAL_LOSSES)
    return Run(name=name, path=path, summary=summary,
               role=run_role(summary.method, summary.executor, f"{path / SUMMARY}: "),
               eval_losses=tuple(float(x) for x in meta.pop("losses")), eval_meta=meta,
               metrics=tuple(read_jsonl(path / METRICS)))


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
    """Per run: method, corpus, tokens/s, mean step time and the ratios against ``baseline``.

    ``speedup`` is the per-step speedup ``baseline mean_step_time_s / run mean_step_time_s`` (the
    SCAPE "x faster per step"); ``throughput_ratio`` is ``run tokens_per_s / baseline
    tokens_per_s`` (the RGC "x the throughput").
    """
    loaded = load_runs(runs)
    base = _named(loaded, baseline, "baseline").summary
    return pd.DataFrame([{
        "run": r.name, "method": r.summary.method, "corpus": r.summary.corpus,
        "workers": workers(r), "steps": r.summary.steps, "tokens_per_s": r.summary.tokens_per_s,
        "mean_step_time_s": r.summary.mean_step_time_s,
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
        "peak_rss_bytes": r.summary.peak_rss_bytes, "peak_gib": r.summary.peak_rss_bytes / GIB,
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
                         "corpus": run.summary.corpus, "sparsity": run.summary.sparsity,
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
    ``dense`` role's run, per corpus (the first run of the role in name order); a corpus without
    such a run has no such rows, and a table without rows is left out."""
    loaded = load_runs(runs)
    tables: dict[str, list[pd.DataFrame]] = {"throughput": [], "memory": [], "communication": []}
    for corpus in sorted({r.summary.corpus for r in loaded.values()}):
        subset = {n: r for n, r in loaded.items() if r.summary.corpus == corpus}
        ref = next((n for n, r in subset.items() if r.role == reference), None)
        if ref is not None:
            tables["throughput"].append(throughput_table(subset, ref))
            tables["memory"].append(memory_table(subset, ref))
        base = next((n for n, r in subset.items() if dense and r.role == dense), None)
        if base is not None:
            tables["communication"].append(communication_table(subset, base))
    return {k: pd.concat(v, ignore_index=True) for k, v in tables.items() if v}


# --------------------------------------------------------------------------------------------
# Non-inferiority, and the records of analysis.json
# --------------------------------------------------------------------------------------------

class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunRecord(_Record):
    """One run as the claims see it (``scale``: :func:`run_scale`)."""

    name: str
    role: str
    method: str
    corpus: str
    seed: int
    sparsity: float | None
    processes: int
    threads: int
    steps: int
    final_bpb: float
    tokens_per_s: float
    mean_step_time_s: float
    peak_rss_bytes: int
    scale: str

    @property
    def world_size(self) -> int | None:
        """As :attr:`Run.world_size`."""
        return self.processes if self.role in DATA_PARALLEL else None


class ComparisonRecord(_Record):
    """One non-inferiority test. Roles, methods, ``sparsity`` and ``processes`` are those of the
    first runs of each side; ``mean_rel_diff``, ``upper_bound`` and ``confidence`` are None and
    ``bootstrap_method`` is empty when the candidate diverged (``note`` says where)."""

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
    mean_rel_diff: float | None
    upper_bound: float | None
    margin: float
    confidence: float | None
    non_inferior: bool
    verdict: str
    bootstrap_method: str
    note: str


class AnalysisRecords(_Record):
    """``analysis.json`` of one stage: its runs, its comparisons and the test's settings."""

    format: Literal["lmrepro.analysis/1"] = ANALYSIS_FORMAT
    stage: str
    stats: StatsConfig
    runs: list[RunRecord]
    comparisons: list[ComparisonRecord]

    def run(self, name: str) -> RunRecord:
        """The run record called ``name``."""
        found = [r for r in self.runs if r.name == name]
        check(len(found) == 1, "run", name, f"must name one run of the {self.stage!r} analysis")
        return found[0]


@dataclass(frozen=True)
class Comparison:
    """Candidate run(s) judged against baseline run(s). Several runs (seeds) are paired
    position by position and their per-batch losses concatenated."""

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
    """``(role, setting, sparsity)``: the setting (corpus, world size) must match to compare."""
    sparsity = None if run.summary.sparsity is None else round(run.summary.sparsity, 6)
    return (run.role, (run.summary.corpus, run.world_size), sparsity)


def _config_label(run: Run) -> str:
    label = run.summary.method
    if run.role in (ROLE_RGC_ASYNC, ROLE_RGC_SYNC):
        label += "-" + run.summary.executor
    if run.role in (ROLE_SCAPE, ROLE_TOPK) and run.summary.sparsity is not None:
        label += f"@{run.summary.sparsity:.0%}"
    if run.world_size is not None:
        label += f" p={run.world_size}"
    return label


def _pair_by_seed(base: list[Run], cand: list[Run]) -> list[tuple[Run, Run]]:
    """Pair runs of two configurations by seed; a lone run on each side pairs regardless."""
    if len(base) == 1 and len(cand) == 1:
        return [(base[0], cand[0])]
    by_seed = {r.summary.seed: r for r in base}
    return [(by_seed[c.summary.seed], c) for c in cand if c.summary.seed in by_seed]


def default_comparisons(runs: Runs) -> list[Comparison]:
    """Comparisons implied by the runs' roles (:data:`DEFAULT_PAIRINGS`), per corpus.

    Runs of one configuration (role, corpus, sparsity, world size) that differ only in seed are
    pooled, paired with the baseline configuration's runs of the same seed. A data-parallel
    candidate is compared with baselines of the same world size (RGC-suite runs have none).
    """
    groups: dict[tuple, list[Run]] = {}
    for run in load_runs(runs).values():
        groups.setdefault(_group_key(run), []).append(run)
    for members in groups.values():
        members.sort(key=lambda r: (str(r.summary.seed), r.name))
    out = []
    for cand_role, base_role in DEFAULT_PAIRINGS:
        for (role, setting, _), cands in groups.items():
            for (brole, bsetting, _), bases in groups.items():
                if (role, brole) != (cand_role, base_role) or setting != bsetting:
                    continue
                if pairs := _pair_by_seed(bases, cands):
                    label = (f"{_config_label(pairs[0][1])} vs {_config_label(pairs[0][0])}"
                             f" ({pairs[0][1].summary.corpus})")
                    out.append(Comparison(baseline=tuple(b.name for b, _ in pairs),
                                          candidate=tuple(c.name for _, c in pairs), label=label))
    return out


def _pooled_losses(loaded: dict[str, Run], comp: Comparison) -> tuple[list[float], list[float]]:
    check(len(comp.baseline) == len(comp.candidate) and comp.baseline, "comparison",
          comp, "must pair as many baseline runs as candidate runs (at least one)")
    base_all: list[float] = []
    cand_all: list[float] = []
    for b_name, c_name in zip(comp.baseline, comp.candidate, strict=True):
        b = _named(loaded, b_name, "comparison.baseline")
        c = _named(loaded, c_name, "comparison.candidate")
        check(b.summary.corpus == c.summary.corpus, f"comparison {comp.label!r}",
              (b.summary.corpus, c.summary.corpus),
              "must compare runs evaluated on the same corpus")
        check(len(b.eval_losses) == len(c.eval_losses), f"{c.path / EVAL_LOSSES}",
              f"<{len(c.eval_losses)} losses>",
              f"must be paired with {b.name!r}: the same {len(b.eval_losses)} eval batches")
        for key in ("batch_size", "context"):
            check(b.eval_meta.get(key) == c.eval_meta.get(key), f"{c.path / EVAL_LOSSES}: {key}",
                  c.eval_meta.get(key), f"must equal {b.name!r}'s {b.eval_meta.get(key)!r} "
                  "(the eval batches must be the same)")
        base_all += b.eval_losses
        cand_all += c.eval_losses
    return base_all, cand_all


def run_comparisons(runs: Runs, comparisons: Sequence[ComparisonSpec] | None = None, *,
                    stats: StatsConfig = DEFAULT_STATS) -> list[ComparisonOutcome]:
    """Run :func:`lmrepro.stats.noninferiority` with ``stats`` for each comparison (default:
    :func:`default_comparisons`) on the pooled, paired per-batch eval losses."""
    loaded = load_runs(runs)
    comps = (default_comparisons(loaded) if comparisons is None
             else [_as_comparison(s) for s in comparisons])
    outcomes = []
    for comp in comps:
        base, cand = _pooled_losses(loaded, comp)
        b, c = loaded[comp.baseline[0]], loaded[comp.candidate[0]]
        bad = [i for i, x in enumerate(cand) if not math.isfinite(x)]
        r = None if bad else noninferiority(base, cand, margin=stats.margin,
                                            confidence=stats.confidence,
                                            n_resamples=stats.n_resamples, seed=stats.seed)
        note = (f"candidate diverged: non-finite eval loss at pooled batch {bad[0]}; counted as "
                "not non-inferior") if bad else (r.fallback_reason or "")
        outcomes.append(ComparisonOutcome(ComparisonRecord(
            label=comp.label, corpus=c.summary.corpus, candidate_role=c.role,
            baseline_role=b.role, candidate_method=c.summary.method,
            baseline_method=b.summary.method, candidate_runs=list(comp.candidate),
            baseline_runs=list(comp.baseline), sparsity=c.summary.sparsity,
            processes=c.summary.processes, n_pairs=len(cand),
            mean_rel_diff=r.mean_rel_diff if r else None,
            upper_bound=r.upper_bound if r else None, margin=stats.margin,
            confidence=r.confidence if r else None, non_inferior=bool(r and r.non_inferior),
            verdict=r.verdict if r else "not non-inferior (diverged)",
            bootstrap_method=r.method if r else "", note=note), r))
    return outcomes


def outcomes_table(outcomes: Sequence[ComparisonOutcome]) -> pd.DataFrame:
    """Per comparison: baseline, candidate, corpus, mean relative difference ``mean(d)``, the
    one-sided upper bound ``U``, the margin, the verdict (``U < margin``) and the pairs.

    ``mean_rel_diff`` and ``upper_bound`` are fractions (0.01 = 1 %) and identical whether the
    losses are read as nats or bits per byte (bpb = nats / ln 2 cancels in the ratio).
    """
    nan = float("nan")
    rows = [{
        "comparison": c.label, "corpus": c.corpus, "baseline": "+".join(c.baseline_runs),
        "candidate": "+".join(c.candidate_runs), "baseline_method": c.baseline_method,
        "candidate_method": c.candidate_method,
        "mean_rel_diff": nan if c.mean_rel_diff is None else c.mean_rel_diff,
        "upper_bound": nan if c.upper_bound is None else c.upper_bound, "margin": c.margin,
        "verdict": c.verdict, "non_inferior": c.non_inferior, "pairs": c.n_pairs,
        "method": c.bootstrap_method, "confidence": nan if c.confidence is None else c.confidence,
        "note": c.note} for c in (o.record for o in outcomes)]
    columns = ["comparison", "corpus", "baseline", "candidate", "baseline_method",
               "candidate_method", "mean_rel_diff", "upper_bound", "margin", "verdict",
               "non_inferior", "pairs", "method", "confidence", "note"]
    df = pd.DataFrame(rows, columns=columns)
    df.attrs["note"] = UNITS_NOTE
    return df


def noninferiority_table(runs: Runs, comparisons: Sequence[ComparisonSpec] | None = None, *,
                         stats: StatsConfig = DEFAULT_STATS) -> pd.DataFrame:
    """:func:`outcomes_table` of :func:`run_comparisons`."""
    return outcomes_table(run_comparisons(runs, comparisons, stats=stats))


def analysis_records(runs: Runs, *, stage: str = "", stats: StatsConfig = DEFAULT_STATS,
                     outcomes: Sequence[ComparisonOutcome] | None = None) -> AnalysisRecords:
    """The records of ``runs`` and of ``outcomes`` (default: :func:`run_comparisons` with
    ``stats``; pass the outcomes computed with the same ``stats`` to avoid a second bootstrap)."""
    loaded = load_runs(runs)
    if outcomes is None:
        outcomes = run_comparisons(loaded, stats=stats)
    keys = set(RunRecord.model_fields) & set(RunSummary.model_fields)
    return AnalysisRecords(stage=stage, stats=stats, comparisons=[o.record for o in outcomes],
                           runs=[RunRecord(name=r.name, role=r.role, scale=run_scale(r),
                                           **r.summary.model_dump(include=keys - {"name"}))
                                 for r in loaded.values()])


def read_analysis(path: str | Path) -> AnalysisRecords:
    """A stage's ``analysis.json``, validated."""
    return AnalysisRecords.model_validate(read_json(path))


# --------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------

def analysis_stage(stage: str, stats: StatsConfig, results_root: str | Path = "results",
                   out_root: str | Path = "results/analysis") -> dict[str, Any]:
    """Throughput, memory, communication and non-inferiority tables of one training stage.

    Reads the finished runs under ``results_root/<stage>/runs``; tables are computed per corpus
    against that corpus's reference role (:data:`STAGE_REFERENCES`) and written as CSV under
    ``out_root/<stage>/``, with ``noninferiority.json`` (the stage's DVC metric),
    ``analysis.json`` (:class:`AnalysisRecords`, read by the claims stage) and the figures as PNG
    (DVC image plots). Returns ``runs``, ``tables``, ``outcomes``, ``records`` and ``figures``.
    """
    from lmrepro.pipeline import plots

    check(stage in STAGE_REFERENCES, "stage", stage, f"must be one of {sorted(STAGE_REFERENCES)}")
    runs_dir = Path(results_root) / stage / "runs"
    runs = load_runs(collect_runs(runs_dir))
    if not runs:
        raise FileNotFoundError(f"no finished runs under {runs_dir}")
    out_dir = Path(out_root) / stage
    frames = reference_tables(runs, *STAGE_REFERENCES[stage])
    outcomes = run_comparisons(runs, stats=stats)
    frames["noninferiority"] = outcomes_table(outcomes)
    for name, frame in frames.items():
        atomic_write_text(out_dir / f"{name}.csv", frame.to_csv(index=False))
    atomic_write_json(out_dir / "noninferiority.json", {
        row["comparison"]: {"mean_rel_diff": row["mean_rel_diff"],
                            "upper_bound": row["upper_bound"],
                            "non_inferior": bool(row["non_inferior"]), "pairs": row["pairs"]}
        for row in frames["noninferiority"].to_dict("records")})
    records = analysis_records(runs, stage=stage, stats=stats, outcomes=outcomes)
    atomic_write_json(out_dir / "analysis.json", records.model_dump(mode="json"))
    figures = {"loss_curves": plots.plot_loss_curves(runs, title=f"{stage}: loss curves"),
               "bootstrap": plots.plot_bootstrap(outcomes)}
    if "communication" in frames:
        figures["bytes_per_step"] = plots.plot_bytes_per_step(runs)
    for name, fig in figures.items():
        plots.save_figure(fig, out_dir / f"{name}.png")
    return {"runs": runs, "tables": frames, "outcomes": outcomes, "records": records,
            "figures": figures}
