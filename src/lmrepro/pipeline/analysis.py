"""Analysis tables, the claims table and plots, computed from run directories.

Every function takes ``runs``: a mapping ``run name -> run directory`` (or an already loaded
:class:`Run`), each directory in the layout of :mod:`lmrepro.results` (``summary.json``,
``eval_losses.json``, ``metrics.jsonl``). Nothing here is typed in by hand except the *paper's*
figures in :data:`CLAIMS`, which are labelled as the paper's; every measured figure is computed
from the runs passed in.

Roles. Comparisons and claims need to know what a run is. The role comes from the summary's
``method`` (case-insensitive, ``-``/space treated as ``_``):

* ``adamw`` / ``dense_adamw`` -> dense AdamW; ``adams`` / ``dense_adams`` -> dense AdamS;
* anything starting with ``scape`` -> SCAPE; containing ``topk`` / ``top_k`` -> raw-gradient top-k;
* ``backprop`` / ``global_backprop`` -> global backprop (the RGC baseline; the single-process
  trainer's ``backprop-adamw`` has no role: it belongs to neither paper's comparisons);
* containing ``rgc`` -> RGC, asynchronous if the method or the summary's ``executor`` says
  ``async``, else synchronous.

Units. Eval losses are in nats; bits per byte is ``loss / ln 2``, so the relative difference
``(candidate - baseline) / baseline`` used by the non-inferiority test is identical in nats and in
bits per byte.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lmrepro.errors import ParameterError, check
from lmrepro.io import read_json
from lmrepro.results import EVAL_LOSSES, read_run
from lmrepro.stats import NonInferiorityResult, noninferiority

GIB = float(1 << 30)
LN2 = math.log(2.0)
BYTE_KINDS = ("grad_values", "param_values", "mask", "total")
NOT_RUN = "not run in this profile"
UNITS_NOTE = ("mean_rel_diff and upper_bound are fractions of the baseline loss (0.01 = 1 %); "
              "bits per byte = nats / ln 2, so they are the same in nats and in bits per byte")

ROLE_ADAMW = "adamw"
ROLE_ADAMS = "adams"
ROLE_SCAPE = "scape"
ROLE_TOPK = "topk"
ROLE_BACKPROP = "backprop"
ROLE_RGC_ASYNC = "rgc_async"
ROLE_RGC_SYNC = "rgc_sync"

# Which candidate roles are judged against which baseline roles (DESIGN.md, "Non-inferiority":
# "The same test judges SCAPE vs dense AdamW/AdamS and RGC vs global backprop").
DEFAULT_PAIRINGS: tuple[tuple[str, str], ...] = (
    (ROLE_SCAPE, ROLE_ADAMW), (ROLE_SCAPE, ROLE_ADAMS),
    (ROLE_TOPK, ROLE_ADAMW), (ROLE_TOPK, ROLE_ADAMS),
    (ROLE_RGC_ASYNC, ROLE_BACKPROP), (ROLE_RGC_SYNC, ROLE_BACKPROP),
)


# --------------------------------------------------------------------------------------------
# Loading runs
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One finished run, as read from its directory by :func:`lmrepro.results.read_run`."""

    name: str
    path: Path
    summary: dict[str, Any]
    eval_losses: tuple[float, ...]
    eval_meta: dict[str, Any]
    metrics: tuple[dict[str, Any], ...] = field(repr=False)

    @property
    def method(self) -> str:
        return str(self.summary.get("method", ""))

    @property
    def corpus(self) -> str:
        return str(self.summary.get("corpus", ""))

    @property
    def role(self) -> str | None:
        return method_role(self.method, self.summary.get("executor"))

    @property
    def sparsity(self) -> float | None:
        s = self.summary.get("sparsity")
        return None if s is None else float(s)

    @property
    def seed(self) -> Any:
        return self.summary.get("seed")

    @property
    def world_size(self) -> int | None:
        w = self.summary.get("world_size")
        return None if w is None else int(w)


RunSource = str | os.PathLike | Run
Runs = Mapping[str, RunSource]


def load_run(name: str, source: RunSource) -> Run:
    """Read one run directory (or pass a :class:`Run` through)."""
    if isinstance(source, Run):
        return source
    path = Path(source)
    check(path.is_dir(), f"runs[{name!r}]", str(path), "must be an existing run directory")
    raw = read_run(path)
    meta = {k: v for k, v in read_json(path / EVAL_LOSSES).items() if k != "losses"}
    return Run(name=name, path=path, summary=raw["summary"],
               eval_losses=tuple(float(x) for x in raw["eval_losses"]), eval_meta=meta,
               metrics=tuple(raw["metrics"]))


def load_runs(runs: Runs) -> dict[str, Run]:
    """``{name: Run}`` for a mapping of run names to run directories (insertion order kept)."""
    check(isinstance(runs, Mapping), "runs", type(runs).__name__,
          "must be a mapping of run name -> run directory")
    return {name: load_run(name, src) for name, src in runs.items()}


def method_role(method: str, executor: Any = None) -> str | None:
    """The role of a run from its summary ``method`` (see the module docstring), or None."""
    m = _norm(method)
    if m in ("adamw", "dense_adamw"):
        return ROLE_ADAMW
    if m in ("adams", "dense_adams"):
        return ROLE_ADAMS
    if m.startswith("scape"):
        return ROLE_SCAPE
    if "topk" in m or "top_k" in m:
        return ROLE_TOPK
    if m in ("backprop", "global_backprop"):
        return ROLE_BACKPROP
    if "rgc" in m:
        is_async = "async" in m or _norm(str(executor or "")) == "async"
        return ROLE_RGC_ASYNC if is_async else ROLE_RGC_SYNC
    return None


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(text).lower()).strip("_")


def corpus_key(corpus: str) -> str:
    """Corpus name for matching: lower case, letters and digits only (``Tiny-Stories`` ->
    ``tinystories``)."""
    return re.sub(r"[^a-z0-9]", "", str(corpus).lower())


def _summary_value(run: Run, key: str) -> Any:
    if key not in run.summary:
        raise ParameterError(f"{run.path / 'summary.json'}: {key}", None,
                             f"run {run.name!r} must record {key!r} in its summary")
    return run.summary[key]


def _positive(run: Run, key: str) -> float:
    value = float(_summary_value(run, key))
    check(math.isfinite(value) and value > 0, f"{run.path / 'summary.json'}: {key}", value,
          "must be a finite number > 0")
    return value


def _baseline(runs: dict[str, Run], baseline: str, what: str) -> Run:
    check(baseline in runs, what, baseline, f"must name one of the runs passed in: {sorted(runs)}")
    return runs[baseline]


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
    base = _baseline(loaded, baseline, "baseline")
    base_step = _positive(base, "mean_step_time_s")
    base_tps = _positive(base, "tokens_per_s")
    rows = []
    for run in loaded.values():
        step = _positive(run, "mean_step_time_s")
        tps = _positive(run, "tokens_per_s")
        rows.append({
            "run": run.name, "method": run.method, "corpus": run.corpus,
            "workers": _workers(run), "steps": run.summary.get("steps"),
            "tokens_per_s": tps, "mean_step_time_s": step,
            "speedup": base_step / step, "throughput_ratio": tps / base_tps,
            "baseline": base.name,
        })
    return pd.DataFrame(rows)


def memory_table(runs: Runs, baseline: str) -> pd.DataFrame:
    """Per run: peak resident memory (bytes and GiB = 2**30 bytes) and its ratio to ``baseline``."""
    loaded = load_runs(runs)
    base_peak = _positive(_baseline(loaded, baseline, "baseline"), "peak_rss_bytes")
    rows = []
    for run in loaded.values():
        peak = _positive(run, "peak_rss_bytes")
        rows.append({
            "run": run.name, "method": run.method, "corpus": run.corpus,
            "peak_rss_bytes": int(peak), "peak_gib": peak / GIB,
            "ratio_vs_baseline": peak / base_peak, "baseline": baseline,
        })
    return pd.DataFrame(rows)


def bytes_per_step(run: Run) -> dict[str, float] | None:
    """Bytes moved per step by kind (``grad_values``, ``param_values``, ``mask``, ``total``).

    From the summary's ``bytes_per_step``; else the mean of the ``bytes_<kind>`` fields of the
    metrics records; None for a run that records no communication (a single-process run).
    """
    summary_bytes = run.summary.get("bytes_per_step")
    if isinstance(summary_bytes, Mapping) and summary_bytes:
        out = {k: float(summary_bytes.get(k, 0.0)) for k in BYTE_KINDS}
        if "total" not in summary_bytes:
            out["total"] = sum(out[k] for k in BYTE_KINDS[:-1])
        return out
    records = [r for r in run.metrics if "bytes_total" in r]
    if not records:
        return None
    return {k: float(np.mean([float(r.get(f"bytes_{k}", 0.0)) for r in records]))
            for k in BYTE_KINDS}


def communication_table(runs: Runs, dense: str) -> pd.DataFrame:
    """Per run that communicates: bytes per step by kind and ``ratio_vs_dense`` = total bytes per
    step over the ``dense`` run's total (runs without communication records are left out)."""
    loaded = load_runs(runs)
    dense_run = _baseline(loaded, dense, "dense")
    dense_bytes = bytes_per_step(dense_run)
    check(dense_bytes is not None and dense_bytes["total"] > 0, "dense", dense,
          "must name a run that records bytes per step (a distributed run)")
    rows = []
    for run in loaded.values():
        b = bytes_per_step(run)
        if b is None:
            continue
        rows.append({
            "run": run.name, "method": run.method, "corpus": run.corpus,
            "sparsity": run.sparsity, "world_size": run.world_size, **b,
            "ratio_vs_dense": b["total"] / dense_bytes["total"], "dense": dense,
        })
    return pd.DataFrame(rows)


def bytes_long(runs: Runs) -> pd.DataFrame:
    """Long form ``run, kind, bytes_per_step`` (kinds other than ``total``) for plotting."""
    rows = []
    for run in load_runs(runs).values():
        b = bytes_per_step(run)
        if b is None:
            continue
        rows += [{"run": run.name, "kind": k, "bytes_per_step": b[k]} for k in BYTE_KINDS[:-1]]
    return pd.DataFrame(rows, columns=["run", "kind", "bytes_per_step"])


# --------------------------------------------------------------------------------------------
# Non-inferiority
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """Candidate run(s) judged against baseline run(s). Several runs (seeds) are paired
    position by position and their per-batch losses concatenated."""

    baseline: tuple[str, ...]
    candidate: tuple[str, ...]
    label: str = ""


@dataclass(frozen=True)
class ComparisonOutcome:
    """A :class:`Comparison` with its test result. ``result`` is None when the candidate diverged
    (non-finite eval loss): it then counts as not non-inferior, ``note`` says why."""

    comparison: Comparison
    corpus: str
    baseline_method: str
    candidate_method: str
    n_pairs: int
    result: NonInferiorityResult | None
    note: str = ""

    @property
    def non_inferior(self) -> bool:
        return self.result is not None and self.result.non_inferior


ComparisonSpec = Comparison | tuple[str | Sequence[str], str | Sequence[str]]


def _as_comparison(spec: ComparisonSpec) -> Comparison:
    if isinstance(spec, Comparison):
        return spec
    check(isinstance(spec, (tuple, list)) and len(spec) == 2, "comparisons[i]", spec,
          "must be a Comparison or a (baseline, candidate) pair of run names")
    base, cand = (tuple([x]) if isinstance(x, str) else tuple(x) for x in spec)
    return Comparison(baseline=base, candidate=cand, label=f"{'+'.join(cand)} vs {'+'.join(base)}")


def _group_key(run: Run) -> tuple:
    sparsity = None if run.sparsity is None else round(run.sparsity, 6)
    return (run.role, corpus_key(run.corpus), sparsity, run.world_size)


def _config_label(run: Run) -> str:
    label = run.method
    if run.role in (ROLE_RGC_ASYNC, ROLE_RGC_SYNC):
        label += "-async" if run.role == ROLE_RGC_ASYNC else "-sync"
    if run.role in (ROLE_SCAPE, ROLE_TOPK) and run.sparsity is not None:
        label += f"@{run.sparsity:.0%}"
    if run.world_size is not None:
        label += f" p={run.world_size}"
    return label


def _pair_by_seed(base: list[Run], cand: list[Run]) -> list[tuple[Run, Run]]:
    """Pair runs of two configurations by seed; a lone run on each side pairs regardless."""
    if len(base) == 1 and len(cand) == 1:
        return [(base[0], cand[0])]
    by_seed = {r.seed: r for r in base}
    return [(by_seed[c.seed], c) for c in cand if c.seed in by_seed]


def default_comparisons(runs: Runs) -> list[Comparison]:
    """Comparisons implied by the runs' roles (:data:`DEFAULT_PAIRINGS`), per corpus.

    Runs of one configuration (role, corpus, sparsity, world size) that differ only in seed are
    pooled, paired with the baseline configuration's runs of the same seed. A candidate is
    compared with baselines of the same world size when the runs record one.
    """
    loaded = load_runs(runs)
    groups: dict[tuple, list[Run]] = {}
    for run in loaded.values():
        if run.role is not None:
            groups.setdefault(_group_key(run), []).append(run)
    for members in groups.values():
        members.sort(key=lambda r: (str(r.seed), r.name))
    out = []
    for cand_role, base_role in DEFAULT_PAIRINGS:
        for ckey, cands in groups.items():
            if ckey[0] != cand_role:
                continue
            for bkey, bases in groups.items():
                same_world = ckey[3] is None or bkey[3] is None or ckey[3] == bkey[3]
                if bkey[0] != base_role or bkey[1] != ckey[1] or not same_world:
                    continue
                pairs = _pair_by_seed(bases, cands)
                if not pairs:
                    continue
                label = (f"{_config_label(pairs[0][1])} vs {_config_label(pairs[0][0])}"
                         f" ({pairs[0][1].corpus})")
                out.append(Comparison(baseline=tuple(b.name for b, _ in pairs),
                                      candidate=tuple(c.name for _, c in pairs), label=label))
    return out


def _pooled_losses(loaded: dict[str, Run], comp: Comparison) -> tuple[list[float], list[float],
                                                                        Run, Run]:
    check(len(comp.baseline) == len(comp.candidate) and comp.baseline, "comparison",
          comp, "must pair as many baseline runs as candidate runs (at least one)")
    base_all: list[float] = []
    cand_all: list[float] = []
    for b_name, c_name in zip(comp.baseline, comp.candidate):
        b = _baseline(loaded, b_name, "comparison.baseline")
        c = _baseline(loaded, c_name, "comparison.candidate")
        check(corpus_key(b.corpus) == corpus_key(c.corpus), f"comparison {comp.label!r}",
              (b.corpus, c.corpus), "must compare runs evaluated on the same corpus")
        check(len(b.eval_losses) == len(c.eval_losses), f"{c.path / EVAL_LOSSES}",
              f"<{len(c.eval_losses)} losses>",
              f"must be paired with {b.name!r}: the same {len(b.eval_losses)} eval batches")
        for key in ("batch_size", "context"):
            check(b.eval_meta.get(key) == c.eval_meta.get(key), f"{c.path / EVAL_LOSSES}: {key}",
                  c.eval_meta.get(key), f"must equal {b.name!r}'s {b.eval_meta.get(key)!r} "
                  "(the eval batches must be the same)")
        base_all += b.eval_losses
        cand_all += c.eval_losses
    first_b, first_c = loaded[comp.baseline[0]], loaded[comp.candidate[0]]
    return base_all, cand_all, first_b, first_c


def run_comparisons(runs: Runs, comparisons: Sequence[ComparisonSpec] | None = None, *,
                    margin: float = 0.01, confidence: float = 0.95, n_resamples: int = 10_000,
                    seed: int = 0) -> list[ComparisonOutcome]:
    """Run :func:`lmrepro.stats.noninferiority` for each comparison (default:
    :func:`default_comparisons`) on the pooled, paired per-batch eval losses."""
    loaded = load_runs(runs)
    comps = (default_comparisons(loaded) if comparisons is None
             else [_as_comparison(s) for s in comparisons])
    outcomes = []
    for comp in comps:
        base, cand, b, c = _pooled_losses(loaded, comp)
        bad = [i for i, x in enumerate(cand) if not math.isfinite(x)]
        if bad:
            result, note = None, (f"candidate diverged: non-finite eval loss at pooled batch "
                                  f"{bad[0]}; counted as not non-inferior")
        else:
            result = noninferiority(base, cand, margin=margin, confidence=confidence,
                                    n_resamples=n_resamples, seed=seed)
            note = result.fallback_reason or ""
        outcomes.append(ComparisonOutcome(
            comparison=comp, corpus=c.corpus, baseline_method=b.method,
            candidate_method=c.method, n_pairs=len(cand), result=result, note=note))
    return outcomes


def outcomes_table(outcomes: Sequence[ComparisonOutcome], margin: float = 0.01) -> pd.DataFrame:
    """The non-inferiority table of already computed outcomes (see :func:`noninferiority_table`).
    ``margin`` is used only for rows without a result (diverged candidates)."""
    rows = []
    for o in outcomes:
        r = o.result
        rows.append({
            "comparison": o.comparison.label, "corpus": o.corpus,
            "baseline": "+".join(o.comparison.baseline),
            "candidate": "+".join(o.comparison.candidate),
            "baseline_method": o.baseline_method, "candidate_method": o.candidate_method,
            "mean_rel_diff": r.mean_rel_diff if r else float("nan"),
            "upper_bound": r.upper_bound if r else float("nan"),
            "margin": r.margin if r else margin,
            "verdict": r.verdict if r else "not non-inferior (diverged)",
            "non_inferior": o.non_inferior, "pairs": o.n_pairs,
            "method": r.method if r else "", "confidence": r.confidence if r else float("nan"),
            "note": o.note,
        })
    columns = ["comparison", "corpus", "baseline", "candidate", "baseline_method",
               "candidate_method", "mean_rel_diff", "upper_bound", "margin", "verdict",
               "non_inferior", "pairs", "method", "confidence", "note"]
    df = pd.DataFrame(rows, columns=columns)
    df.attrs["note"] = UNITS_NOTE
    return df


def noninferiority_table(runs: Runs, comparisons: Sequence[ComparisonSpec] | None = None, *,
                         margin: float = 0.01, confidence: float = 0.95,
                         n_resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Per comparison: baseline, candidate, corpus, mean relative difference ``mean(d)``, the
    one-sided upper bound ``U``, the margin, the verdict (``U < margin``) and the pairs.

    ``mean_rel_diff`` and ``upper_bound`` are fractions (0.01 = 1 %) and identical whether the
    losses are read as nats or bits per byte (bpb = nats / ln 2 cancels in the ratio).
    """
    outcomes = run_comparisons(runs, comparisons, margin=margin, confidence=confidence,
                               n_resamples=n_resamples, seed=seed)
    return outcomes_table(outcomes, margin=margin)



# --------------------------------------------------------------------------------------------
# Claims
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """A headline claim of one of the papers (DESIGN.md, "The two papers"). ``paper_figure`` and
    ``paper_scale`` are the paper's; ``rule`` says how our measurement is judged."""

    id: str
    paper: str
    claim: str
    paper_figure: str
    paper_scale: str
    rule: str


@dataclass(frozen=True)
class _Measured:
    corpus: str
    measured: str
    value: float
    reproduced: bool
    scale: str


SCAPE = "SCAPE (arXiv 2607.01678)"
RGC = "RGC (bounded-horizon local training)"
_SCAPE_SCALE = "GPT-345M / OpenWebText and Llama-500M / SlimPajama-6B, 32 GH200 GPUs"
_RGC_SCALE = "24-layer byte-level transformer, 4 stages x 6 layers, 31 CPU cores"


def _ni_claim(cid: str, sparsity: int, base: str) -> Claim:
    return Claim(
        cid, SCAPE,
        f"SCAPE at {sparsity} % sparsity: validation loss comparable to dense {base}",
        "paper: comparable (no quality loss)", _SCAPE_SCALE,
        "same verdict: reproduced iff our paired bootstrap test finds SCAPE non-inferior "
        "(one-sided upper bound U < margin)")


CLAIMS: tuple[Claim, ...] = (
    _ni_claim("scape-90-adamw", 90, "AdamW"),
    _ni_claim("scape-90-adams", 90, "AdamS"),
    _ni_claim("scape-99-adamw", 99, "AdamW"),
    _ni_claim("scape-99-adams", 99, "AdamS"),
    Claim("scape-step-speedup", SCAPE, "SCAPE is up to 3.26x faster per step than dense AdamS",
          "paper: up to 3.26x (Llama-1.8B)", "Llama-1.8B, 32 GH200 GPUs",
          "direction: reproduced iff our best SCAPE per-step speedup over dense AdamS "
          "(same corpus and world size) is > 1; the magnitude depends on the interconnect"),
    Claim("scape-wallclock", SCAPE,
          "SCAPE cuts end-to-end wall-clock by up to 43.3 % versus dense training",
          "paper: up to 43.3 % less (Llama-500M)", "Llama-500M / SlimPajama-6B, 32 GH200 GPUs",
          "direction: reproduced iff our best SCAPE run takes less time (steps x mean step "
          "time) than the faster dense baseline (AdamW or AdamS) of the same corpus and world "
          "size"),
    Claim("topk-unstable", SCAPE,
          "raw-gradient top-k is unstable with Adam-style optimizers at high sparsity (the foil)",
          "paper: unstable at high sparsity", _SCAPE_SCALE,
          "reproduced iff our top-k run at its highest sparsity diverges or is not "
          "non-inferior to dense AdamS"),
    Claim("rgc-throughput", RGC, "async RGC has 1.382x the throughput of global backprop",
          "paper: 1.382x tokens/s", _RGC_SCALE,
          "direction: reproduced iff async RGC tokens/s over backprop tokens/s is > 1 "
          "(same corpus)"),
    Claim("rgc-memory", RGC, "async RGC peaks at 4.31 GiB versus 1.94 GiB for backprop",
          "paper: 4.31 vs 1.94 GiB (2.22x)", _RGC_SCALE,
          "direction: reproduced iff async RGC's peak resident memory exceeds backprop's "
          "(ratio > 1)"),
    Claim("rgc-enwik8", RGC,
          "enwik8: async RGC 0.841 % worse bits per byte on average, one-sided 95 % upper "
          "bound 2.095 %: fails the 1 % non-inferiority margin",
          "paper: mean +0.841 %, U = 2.095 %, not non-inferior", _RGC_SCALE + ", enwik8",
          "same verdict: reproduced iff our test also finds async RGC NOT non-inferior "
          "(U >= margin)"),
    Claim("rgc-tinystories", RGC, "TinyStories: async RGC more than 2.5 % worse than backprop",
          "paper: > 2.5 % worse", _RGC_SCALE + ", TinyStories",
          "threshold: reproduced iff our mean relative difference is > +2.5 %"),
)


def _workers(run: Run) -> str:
    s = run.summary
    if s.get("world_size") is not None:
        return f"{int(s['world_size'])} workers"
    for key in ("total_threads", "threads", "num_threads", "cores"):
        if s.get(key) is not None:
            return f"{s[key]} {'cores' if key == 'cores' else 'threads'}"
    return "n/a"


def run_scale(run: Run) -> str:
    """The scale a run was measured at: model size, steps, corpus, workers/cores (whatever the
    summary records; ``n_params``, ``n_layers``/``d_model`` (or ``model.n_layers``/``d_model``),
    ``world_size``, ``total_threads``/``threads``/``cores`` are optional keys)."""
    s = run.summary
    parts = []
    n_params = s.get("n_params", s.get("num_params"))
    model = s.get("model") if isinstance(s.get("model"), Mapping) else {}
    n_layers = s.get("n_layers", model.get("n_layers"))
    d_model = s.get("d_model", model.get("d_model"))
    if n_params is not None:
        parts.append(f"{float(n_params) / 1e6:.2f}M params")
    if n_layers is not None and d_model is not None:
        parts.append(f"{n_layers} layers x d={d_model}")
    if s.get("steps") is not None:
        parts.append(f"{s['steps']} steps")
    parts.append(run.corpus or "corpus n/a")
    parts.append(_workers(run))
    return ", ".join(parts)


def _fmt_pct(x: float) -> str:
    return f"{x * 100:+.3f} %"


def _ni_text(o: ComparisonOutcome) -> str:
    if o.result is None:
        return f"diverged ({o.note}); {o.n_pairs} pairs"
    r = o.result
    return (f"mean d {_fmt_pct(r.mean_rel_diff)}, U {_fmt_pct(r.upper_bound)} "
            f"(margin {r.margin:.1%}): {r.verdict}; {r.n_pairs} pairs, {r.method}")


def _outcome_runs(loaded: dict[str, Run], o: ComparisonOutcome) -> tuple[Run, Run]:
    return loaded[o.comparison.baseline[0]], loaded[o.comparison.candidate[0]]


def _measure_ni_claim(loaded: dict[str, Run], outcomes: list[ComparisonOutcome],
                      cand_role: str, base_role: str, sparsity: float | None,
                      corpus: str | None, want_non_inferior: bool) -> list[_Measured]:
    out = []
    for o in outcomes:
        b, c = _outcome_runs(loaded, o)
        if c.role != cand_role or b.role != base_role:
            continue
        if sparsity is not None and (c.sparsity is None or abs(c.sparsity - sparsity) > 1e-6):
            continue
        if corpus is not None and corpus_key(c.corpus) != corpus:
            continue
        value = o.result.mean_rel_diff if o.result else float("nan")
        out.append(_Measured(c.corpus, _ni_text(o), value,
                             o.non_inferior == want_non_inferior,
                             f"{run_scale(c)}; {o.n_pairs} eval batches"))
    return out


def _same_setting(a: Run, b: Run) -> bool:
    same_world = a.world_size is None or b.world_size is None or a.world_size == b.world_size
    return corpus_key(a.corpus) == corpus_key(b.corpus) and same_world


def _measure_step_speedup(loaded: dict[str, Run]) -> list[_Measured]:
    best: tuple[float, Run, Run] | None = None
    for c in loaded.values():
        if c.role != ROLE_SCAPE:
            continue
        for b in loaded.values():
            if b.role == ROLE_ADAMS and _same_setting(b, c):
                x = _positive(b, "mean_step_time_s") / _positive(c, "mean_step_time_s")
                if best is None or x > best[0]:
                    best = (x, b, c)
    if best is None:
        return []
    x, b, c = best
    return [_Measured(c.corpus, f"{x:.3f}x per step ({c.name} vs {b.name})", x, x > 1.0,
                      run_scale(c))]


def _wall(run: Run) -> float:
    return _positive(run, "mean_step_time_s") * float(_summary_value(run, "steps"))


def _measure_wallclock(loaded: dict[str, Run]) -> list[_Measured]:
    best: tuple[float, Run, Run] | None = None
    for c in loaded.values():
        if c.role != ROLE_SCAPE:
            continue
        dense = [b for b in loaded.values()
                 if b.role in (ROLE_ADAMW, ROLE_ADAMS) and _same_setting(b, c)]
        if not dense:
            continue
        b = min(dense, key=_wall)
        reduction = 1.0 - _wall(c) / _wall(b)
        if best is None or reduction > best[0]:
            best = (reduction, b, c)
    if best is None:
        return []
    red, b, c = best
    return [_Measured(c.corpus, f"{red:.1%} less ({c.name} vs {b.name})", red, red > 0.0,
                      run_scale(c))]


def _measure_topk(loaded: dict[str, Run], outcomes: list[ComparisonOutcome]) -> list[_Measured]:
    topk = [o for o in outcomes
            if _outcome_runs(loaded, o)[1].role == ROLE_TOPK
            and _outcome_runs(loaded, o)[0].role == ROLE_ADAMS]
    if not topk:
        return []
    top = max(_outcome_runs(loaded, o)[1].sparsity or 0.0 for o in topk)
    picked = [o for o in topk if (_outcome_runs(loaded, o)[1].sparsity or 0.0) == top]
    out = []
    for o in picked:
        c = _outcome_runs(loaded, o)[1]
        value = o.result.mean_rel_diff if o.result else float("nan")
        out.append(_Measured(c.corpus, f"top-k @ {top:.0%}: {_ni_text(o)}", value,
                             not o.non_inferior, run_scale(c)))
    return out


def _measure_rgc_ratio(loaded: dict[str, Run], key: str) -> list[_Measured]:
    out = []
    for c in loaded.values():
        if c.role != ROLE_RGC_ASYNC:
            continue
        for b in loaded.values():
            if b.role != ROLE_BACKPROP or not _same_setting(b, c):
                continue
            ratio = _positive(c, key) / _positive(b, key)
            if key == "tokens_per_s":
                text = (f"{ratio:.3f}x tokens/s ({c.summary[key]:.4g} vs "
                        f"{b.summary[key]:.4g}; {c.name} vs {b.name})")
            else:
                text = (f"{_positive(c, key) / GIB:.3f} vs {_positive(b, key) / GIB:.3f} GiB "
                        f"({ratio:.2f}x; {c.name} vs {b.name})")
            out.append(_Measured(c.corpus, text, ratio, ratio > 1.0, run_scale(c)))
    return out


def _measure_tinystories(loaded: dict[str, Run], outcomes: list[ComparisonOutcome]
                         ) -> list[_Measured]:
    out = []
    for m in _measure_ni_claim(loaded, outcomes, ROLE_RGC_ASYNC, ROLE_BACKPROP, None,
                               "tinystories", want_non_inferior=False):
        reproduced = math.isnan(m.value) or m.value > 0.025
        out.append(_Measured(m.corpus, m.measured, m.value, reproduced, m.scale))
    return out


def _claim_measurers(loaded: dict[str, Run], outcomes: list[ComparisonOutcome]
                     ) -> dict[str, Callable[[], list[_Measured]]]:
    ni = _measure_ni_claim
    return {
        "scape-90-adamw": lambda: ni(loaded, outcomes, ROLE_SCAPE, ROLE_ADAMW, 0.9, None, True),
        "scape-90-adams": lambda: ni(loaded, outcomes, ROLE_SCAPE, ROLE_ADAMS, 0.9, None, True),
        "scape-99-adamw": lambda: ni(loaded, outcomes, ROLE_SCAPE, ROLE_ADAMW, 0.99, None, True),
        "scape-99-adams": lambda: ni(loaded, outcomes, ROLE_SCAPE, ROLE_ADAMS, 0.99, None, True),
        "scape-step-speedup": lambda: _measure_step_speedup(loaded),
        "scape-wallclock": lambda: _measure_wallclock(loaded),
        "topk-unstable": lambda: _measure_topk(loaded, outcomes),
        "rgc-throughput": lambda: _measure_rgc_ratio(loaded, "tokens_per_s"),
        "rgc-memory": lambda: _measure_rgc_ratio(loaded, "peak_rss_bytes"),
        "rgc-enwik8": lambda: ni(loaded, outcomes, ROLE_RGC_ASYNC, ROLE_BACKPROP, None,
                                 "enwik8", False),
        "rgc-tinystories": lambda: _measure_tinystories(loaded, outcomes),
    }


def claims_table(runs: Runs, *, margin: float = 0.01, confidence: float = 0.95,
                 n_resamples: int = 10_000, seed: int = 0,
                 outcomes: Sequence[ComparisonOutcome] | None = None) -> pd.DataFrame:
    """Each headline claim of the papers (:data:`CLAIMS`) beside our measured figure.

    Columns: ``id``, ``paper``, ``claim``, ``paper_figure`` (the paper's, labelled ``paper:``),
    ``paper_scale``, ``measured`` (computed from ``runs``), ``measured_value`` (the number behind
    it: a fraction or a ratio), ``our_scale``, ``corpus``, ``rule`` and ``reproduced`` (``yes``,
    ``no`` or ``not run in this profile`` when the runs a claim needs are absent). A claim matched
    by several settings (e.g. two corpora) gets one row each. ``outcomes`` (from
    :func:`run_comparisons`) avoids re-running the bootstrap.
    """
    loaded = load_runs(runs)
    if outcomes is None:
        outcomes = run_comparisons(loaded, margin=margin, confidence=confidence,
                                   n_resamples=n_resamples, seed=seed)
    measurers = _claim_measurers(loaded, list(outcomes))
    rows = []
    for claim in CLAIMS:
        base = {"id": claim.id, "paper": claim.paper, "claim": claim.claim,
                "paper_figure": claim.paper_figure, "paper_scale": claim.paper_scale}
        measured = measurers[claim.id]()
        if not measured:
            rows.append({**base, "measured": NOT_RUN, "measured_value": float("nan"),
                         "our_scale": "", "corpus": "", "rule": claim.rule,
                         "reproduced": NOT_RUN})
        for m in measured:
            rows.append({**base, "measured": m.measured, "measured_value": m.value,
                         "our_scale": m.scale, "corpus": m.corpus, "rule": claim.rule,
                         "reproduced": "yes" if m.reproduced else "no"})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Plots (matplotlib Figures without pyplot state; seaborn draws on their axes)
# --------------------------------------------------------------------------------------------

def loss_curves_frame(runs: Runs) -> pd.DataFrame:
    """Long form ``run, step, kind, bpb`` from metrics.jsonl: ``train`` rows from ``loss`` (nats,
    converted to bits per byte) and ``eval`` rows from ``eval_bpb``."""
    rows = []
    for run in load_runs(runs).values():
        for rec in run.metrics:
            if "step" not in rec:
                continue
            if "eval_bpb" in rec:
                rows.append({"run": run.name, "step": rec["step"], "kind": "eval",
                             "bpb": float(rec["eval_bpb"])})
            if "loss" in rec:
                rows.append({"run": run.name, "step": rec["step"], "kind": "train",
                             "bpb": float(rec["loss"]) / LN2})
    return pd.DataFrame(rows, columns=["run", "step", "kind", "bpb"])


def plot_loss_curves(runs: Runs, *, title: str = "Loss curves") -> Figure:
    """Training loss (line) and evaluation bits per byte (markers) per run against the step."""
    import seaborn as sns

    df = loss_curves_frame(runs)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    train, ev = df[df.kind == "train"], df[df.kind == "eval"]
    if not train.empty:
        sns.lineplot(data=train, x="step", y="bpb", hue="run", ax=ax, linewidth=1.2)
    if not ev.empty:
        sns.scatterplot(data=ev, x="step", y="bpb", hue="run", ax=ax, marker="o", s=30,
                        legend=train.empty)
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte (train: lines, eval: dots)")
    ax.set_title(title)
    return fig


def plot_bytes_per_step(runs: Runs, *, log: bool = True,
                        title: str = "Bytes per step by kind") -> Figure:
    """Grouped bars: bytes each run's collectives move per step, by kind."""
    import seaborn as sns

    df = bytes_long(runs)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    if not df.empty:
        sns.barplot(data=df, x="run", y="bytes_per_step", hue="kind", ax=ax)
        if log and (df.bytes_per_step > 0).any():
            ax.set_yscale("log")
    ax.set_ylabel("bytes per step")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def plot_bootstrap(outcomes: Sequence[ComparisonOutcome], *, ncols: int = 2) -> Figure:
    """One panel per comparison: the bootstrap distribution of the mean relative difference
    (percent), the margin (red vertical line), the upper bound U (dashed) and mean d (dotted)."""
    import seaborn as sns

    with_result = [o for o in outcomes if o.result is not None]
    n = max(1, len(with_result))
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(5 * ncols, 3.2 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, o in zip(axes, with_result):
        r = o.result
        sns.histplot(x=r.bootstrap_distribution * 100, bins=60, stat="density", ax=ax,
                     color="tab:blue", alpha=0.5)
        ax.axvline(r.margin * 100, color="tab:red", linewidth=2, label=f"margin {r.margin:.1%}")
        ax.axvline(r.upper_bound * 100, color="black", linestyle="--",
                   label=f"U {r.upper_bound:+.2%}")
        ax.axvline(r.mean_rel_diff * 100, color="gray", linestyle=":",
                   label=f"mean {r.mean_rel_diff:+.2%}")
        ax.set_title(f"{o.comparison.label}: {r.verdict}", fontsize=9)
        ax.set_xlabel("mean relative difference (%)")
        ax.legend(fontsize=7)
    for ax in axes[len(with_result):]:
        ax.set_axis_off()
    return fig

