"""The RGC paper's headline claims, each declared once with the function that measures it from
the ``rgc`` analysis (:class:`~lmrepro.pipeline.records.AnalysisRecords`)."""

from __future__ import annotations

import dataclasses
import math

from lmrepro.pipeline.records import AnalysisRecords, ResourceRecord
from lmrepro.pipeline.runs import GIB
from lmrepro.pipeline.claims import (Claim, Measured, Tolerance, comparison_scale,
                                     interval_label, label, noninferiority_measure, pooled_text,
                                     resources, spread_text, timing_untestable)
from lmrepro.pipeline.resources import ONE_SESSION_CAVEAT
from lmrepro.rgc.roles import ROLE_BACKPROP, ROLE_RGC_ASYNC, ROLE_RGC_SYNC

PAPER = "RGC (bounded-horizon local training)"
SOURCE = "the paper's summary (docs/papers.md; the full text was not available)"
#: the paper's peak-memory ratio (4.31 / 1.94 GiB) and the tolerance a figure must meet to
#: reproduce it (a ratio within 25 % of it on the log scale; outside, a larger peak is direction
#: only)
PAPER_MEMORY_RATIO = 4.31 / 1.94
MEMORY_TOLERANCE = 0.25
MEMORY = Tolerance(PAPER_MEMORY_RATIO, MEMORY_TOLERANCE, log=True)
#: the paper's throughput ratio (1.382x) within 10 %: every throughput figure's tolerance
THROUGHPUT_TOLERANCE = 0.10
THROUGHPUT = Tolerance(1.382, THROUGHPUT_TOLERANCE)
SCALE = "24-layer byte-level transformer, 4 stages x 6 layers, 31 CPU cores"
#: the paper's enwik8 figures: mean relative difference and one-sided 95 % upper bound
PAPER_ENWIK8_MEAN, PAPER_ENWIK8_UPPER = 0.00841, 0.02095
#: the enwik8 gap: the paper's mean, on the side of a positive gap (judged by whether our
#: interval holds it: :func:`lmrepro.pipeline.claims.interval_label`)
ENWIK8_GAP = Tolerance.band(PAPER_ENWIK8_MEAN, 0.0, PAPER_ENWIK8_UPPER, reference=0.0, unit="%")
#: the stage whose records hold the training-length study's verdict point
STUDY_STAGE = "rgc_scaling"


def _allocation(r: ResourceRecord) -> str:
    """The core budgets compared, in words (the paper's 1.382x is 29 async worker threads
    against 24 for backprop: an allocation, not the same budget)."""
    c, b = r.candidate_threads, r.baseline_threads
    if c == b:
        return f"same core budget: {c} threads each"
    return f"async {c} threads vs backprop {b} (ratio {c / b:.3f}; the paper's 29:24 = 1.208)"


def throughput(records: AnalysisRecords) -> list[Measured]:
    """Async RGC tokens/s over backprop tokens/s (means over the seeds), per setting, with the
    core budgets compared, judged by :data:`THROUGHPUT` (:func:`label`). Where the timing
    history holds two or more sessions of the suite on this machine, the ratio judged is the
    one pooled over them, inconclusive inside its session-level interval (shown beside this
    run's own figure); else this run's, inconclusive inside its run-level interval (one seed:
    the step-time spread)."""
    out = []
    for r in resources(records, ROLE_RGC_ASYNC, ROLE_BACKPROP):
        x, conclusive, caveats = r.throughput_ratio, r.throughput_conclusive, tuple(r.caveats)
        text = (f"{x:.3g}x tokens/s ({r.candidate_tokens_per_s:.4g} vs "
                f"{r.baseline_tokens_per_s:.4g}; {_allocation(r)}; "
                f"{spread_text(r, x, r.throughput_halfwidth)})")
        p = r.pooled_throughput
        if p is not None:
            text = f"this run {text}; {pooled_text(p, r)}"
            if p.basis == "sessions":   # the sessions' spread decides, not this session's
                x, conclusive = p.ratio, p.conclusive
                caveats = tuple(c for c in caveats if c != ONE_SESSION_CAVEAT)
        reproduced, direction_only = label(x, THROUGHPUT, conclusive)
        why = timing_untestable(r)
        out.append(Measured(r.corpus, text if why is None else f"not testable here: {why}; "
                            f"this run {text}", x, reproduced,
                            comparison_scale(records, r.candidate_runs),
                            caveats + (() if why is None else (why,)),
                            direction_only=direction_only, untestable_here=why is not None))
    return out


def memory_label(ratios: dict[str, float]) -> tuple[bool | None, bool]:
    """The memory claim's label from the ratio on each metric recorded (``{"RSS": x, "PSS":
    y}``): the paper names no metric, so *reproduced* only where every recorded metric lies
    within the tolerance, *in direction only* where every one is above 1, *not reproduced*
    where every one is at or below 1, else inconclusive (the metrics disagree in direction)."""
    labels = [label(x, MEMORY) for x in ratios.values()]
    if not labels:
        return False, False
    if all(ok and not direction for ok, direction in labels):
        return True, False
    if all(ok for ok, _ in labels):
        return True, True
    if not any(ok for ok, _ in labels):
        return False, False
    return None, False


def memory(records: AnalysisRecords) -> list[Measured]:
    """Async RGC peak memory over backprop's (means over the seeds), per setting, on peak RSS
    and peak PSS of the process tree (PSS counts a page shared by several processes, such as
    the torch libraries every worker maps, once; RSS once per process), judged by
    :func:`memory_label`. The runs' peaks are their training phase's (each run in a fresh
    process tree; the evaluation copy and the hand-over are their own rows, docs/rgc.md
    "Memory")."""
    out = []
    for r in resources(records, ROLE_RGC_ASYNC, ROLE_BACKPROP):
        ratios = {} if r.memory_ratio is None else {"RSS": r.memory_ratio}
        text = (f"{r.candidate_peak_rss_bytes / GIB:.3f} vs {r.baseline_peak_rss_bytes / GIB:.3f}"
                f" GiB peak RSS ({r.memory_ratio or math.nan:.2f}x)")
        if r.pss_ratio is not None and r.candidate_peak_pss_bytes and r.baseline_peak_pss_bytes:
            ratios["PSS"] = r.pss_ratio
            text += (f", {r.candidate_peak_pss_bytes / GIB:.3f} vs "
                     f"{r.baseline_peak_pss_bytes / GIB:.3f} GiB peak PSS ({r.pss_ratio:.2f}x)")
        else:
            text += ", PSS not recorded"
        reproduced, direction_only = memory_label(ratios)
        x = ratios.get("PSS", ratios.get("RSS", math.nan))
        out.append(Measured(r.corpus, f"{text} against the paper's {PAPER_MEMORY_RATIO:.2f}x; "
                            "training phase, evaluation copy and hand-over excluded; "
                            f"{r.candidate_processes} processes vs {r.baseline_processes}", x,
                            reproduced, comparison_scale(records, r.candidate_runs),
                            direction_only=direction_only))
    return out


def paper_ratio(records: AnalysisRecords) -> list[Measured]:
    """The RGC benchmark's async/backprop tokens/s at the paper's 29:24 core ratio (backprop
    under a CPU quota), decomposed into its factors, with the factors' prediction for the
    paper's machine (:mod:`lmrepro.rgc.analysis.speedup`), judged by :data:`THROUGHPUT`. Shown
    beside a profile's own async-vs-backprop throughput (not run where the profile runs none)."""
    from lmrepro.rgc.analysis import speedup

    r = speedup.load("rgc")
    if r is None or not resources(records, ROLE_RGC_ASYNC, ROLE_BACKPROP):
        return []
    rows = [x for x in speedup.benchmark_factors(r) if x[0].startswith("the paper's")]
    if not rows:
        return []
    _, f, x = rows[0]
    pred = speedup.prediction(r, speedup.load("rgc_paper_shape"))
    spread = repeat_range(r)
    text = (f"{x:.3g}x tokens/s at 29:24 = core ratio {f.core_ratio:.3f} x work efficiency "
            f"{f.work_efficiency:.3f} x utilisation {f.utilisation:.3f} x executor efficiency "
            f"{f.executor_efficiency:.3f}")
    if pred is not None:
        text += (f"; predicted for the paper's placement and shape {pred['predicted']:.2f}x "
                 f"(its non-core factors would need {pred['needed_non_core']:.3f}, ours "
                 f"{pred['predicted'] / pred['core_ratio']:.3f})")
    cfg = r["config"]
    m = cfg["model"]
    scale = (f"benchmark (bench/bench_rgc.py): {m['n_layers']} layers x d={m['d_model']}, "
             f"{cfg['n_stages']} stages on {len(r['placement'])} workers, "
             f"{r['machine'].get('usable_cores')} cores")
    if spread is None:
        why = ("one benchmark figure with no spread (a timing verdict needs repeated timings: "
               "bench/bench_rgc.py --repeats 2 or more)")
        return [Measured("", f"not testable here: {why}; the benchmark's {text}", x, None,
                         scale, (why,), untestable_here=True)]
    low, high = spread
    text += f"; {low:.3g}x to {high:.3g}x over the benchmark's {r['args']['repeats']} repeats"
    reproduced, direction_only = label(x, THROUGHPUT, decided=low > 1 or high < 1)
    return [Measured("", text, x, reproduced, scale, direction_only=direction_only)]


def repeat_range(r: dict) -> tuple[float, float] | None:
    """The lowest and highest async / backprop-at-29:24 tokens/s over the benchmark's repeats
    (every async repeat against every backprop repeat); None with fewer than two a side."""
    runs = r.get("runs", {})
    a = [x["tokens_per_s"] for x in runs.get("async", [])]
    b = [x["tokens_per_s"] for x in runs.get("backprop-paper-ratio", [])]
    if len(a) < 2 or len(b) < 2:
        return None
    return min(a) / max(b), max(a) / min(b)


def length_study(records: AnalysisRecords) -> list[Measured]:
    """Lockstep RGC (the sync executor, which computes what async does) against backprop at the
    training-length study's verdict point: the enwik8 claim's stand-in where the models have
    left the n-gram floor, judged by :data:`ENWIK8_GAP` (:func:`label`) once the test, too,
    finds RGC not non-inferior (non-inferior: not reproduced)."""
    study = records.model_copy(update={"comparisons": [
        c for c in records.comparisons
        if c.candidate_runs and all(r.startswith(f"{STUDY_STAGE}/") for r in c.candidate_runs)]})
    measure = noninferiority_measure(ROLE_RGC_SYNC, ROLE_BACKPROP, non_inferior=False)
    out = []
    for m in measure(study):
        reproduced, direction_only, larger = interval_label(m.value, m.lower, m.upper,
                                                            ENWIK8_GAP)
        if math.isnan(m.value):               # a diverged RGC run: worse, by any margin
            reproduced, direction_only, larger = True, True, True
        if m.reproduced is not True:          # non-inferior: the paper's verdict is not ours
            reproduced, direction_only, larger = m.reproduced, False, None
        out.append(dataclasses.replace(m, reproduced=reproduced, direction_only=direction_only,
                                       larger=larger))
    return out


def tinystories(records: AnalysisRecords) -> list[Measured]:
    """Async RGC against backprop on TinyStories: reproduced iff more than 2.5 % worse (or
    diverged)."""
    measure = noninferiority_measure(ROLE_RGC_ASYNC, ROLE_BACKPROP, non_inferior=False,
                                     corpus="tinystories")
    return [dataclasses.replace(m, reproduced=math.isnan(m.value) or m.value > 0.025)
            for m in measure(records)]


CLAIMS: tuple[Claim, ...] = (
    Claim("rgc-throughput", PAPER, "async RGC has 1.382x the throughput of global backprop",
          "paper: 1.382x tokens/s, async 29 worker threads vs backprop 24", SOURCE, SCALE,
          "reproduced iff async RGC tokens/s (the suite's async runs, in lockstep: "
          "the decoder's consensus every step; running ahead is measured by the benchmark, "
          "docs/rgc.md) over backprop tokens/s is within 10 % of 1.382x; above 1 outside it: "
          "direction only; the ratio judged is pooled over every recorded session of the "
          "suite on this machine (the timing history: session-level t interval, docs/"
          "statistics.md), or with one session this run's, inconclusive inside its interval "
          "(same corpus, at the profile's core budgets: equal in the default profile, 29:24 in "
          "the paper profile; the measured figure names them). A systems figure: on 2 cores it "
          "also carries the machine's load (docs/performance.md). Not testable here with "
          "runs shorter than 50 steps or no spread", throughput,
          caveat="a systems figure: the paper's gain comes from giving async RGC 29 threads "
          "against 24 for backprop; at equal cores it measures scheduling alone",
          tolerance=THROUGHPUT),
    Claim("rgc-throughput-paper-ratio", PAPER,
          "async RGC has 1.382x the throughput of global backprop with 29 worker threads "
          "against 24 (a systems gain: the core ratio and smaller per-stage thread groups)",
          "paper: 1.382x tokens/s", SOURCE, SCALE,
          "at the paper's 29:24 core ratio: reproduced iff within 10 % of 1.382x; above 1 "
          "outside it: direction only, inconclusive where the range over the benchmark's "
          "repeats holds 1; not testable here with one benchmark figure and no spread; the "
          "ratio decomposed (docs/rgc.md, \"The throughput ratio decomposed\")", paper_ratio,
          caveat="a benchmark of a small model on 2 cores, not the pipeline's runs: backprop's "
          "24/29 of the cores are a CPU quota; the prediction for the paper's machine uses "
          "1-thread stage groups measured here for the paper's 7-thread ones",
          tolerance=THROUGHPUT),
    Claim("rgc-memory", PAPER, "async RGC peaks at 4.31 GiB versus 1.94 GiB for backprop",
          "paper: 4.31 vs 1.94 GiB (2.22x), attributed to activation copies and snapshots",
          SOURCE, SCALE,
          "the paper names no metric, so both are judged: reproduced iff async RGC's "
          "(lockstep) peak over backprop's lies within 25 % of the paper's 2.22x (on the log "
          "scale: 1.78x to 2.78x) on peak RSS and on peak PSS of the process tree alike; "
          "reproduced in direction only iff both are above 1 but not both inside; "
          "inconclusive iff they disagree in direction (docs/rgc.md, \"Which memory the paper "
          "reports\"). Each run in a fresh process tree, its peak the training phase's: the "
          "evaluation copy of the model and the hand-over of the final state are their own "
          "rows (notebook 07)",
          memory, caveat="the verdict is on the ratios, not on the paper's attribution "
          "(\"activation copies and snapshots\"): RSS charges async one torch runtime per "
          "worker, and at our sizes the runtimes, not activations, make most of the "
          "difference (the byte account's excess explained, notebook 07)", tolerance=MEMORY),
    Claim("rgc-enwik8", PAPER,
          "enwik8: async RGC 0.841 % worse bits per byte on average, one-sided 95 % upper "
          "bound 2.095 %: fails the 1 % non-inferiority margin",
          "paper: mean +0.841 %, U = 2.095 %, not non-inferior", SOURCE, SCALE + ", enwik8",
          "same verdict: reproduced iff our test also finds async RGC NOT non-inferior "
          "(U >= margin)",
          noninferiority_measure(ROLE_RGC_ASYNC, ROLE_BACKPROP, non_inferior=False,
                                 corpus="enwik8")),
    Claim("rgc-quality-length", PAPER,
          "enwik8: async RGC 0.841 % worse bits per byte on average, one-sided 95 % upper "
          "bound 2.095 %: fails the 1 % non-inferiority margin (its stand-in: the training-"
          "length study's verdict point on the embedded corpus, past the n-gram floor)",
          "paper: mean +0.841 %, U = 2.095 %, not non-inferior (reproduced iff our interval "
          "[L, U] holds +0.841 %)", SOURCE, SCALE + ", enwik8",
          "reproduced iff our test at the study's verdict point finds lockstep RGC NOT "
          "non-inferior (U >= margin) and our interval [L, U] holds the paper's mean gap "
          "(+0.841 %: consistent with it, not merely inside a band); not non-inferior with "
          "the interval above it: larger than the paper's (a larger gap), below it: smaller",
          length_study, caveat="a stand-in: Shakespeare, not enwik8, and a 4- to 8-layer model "
          "of 1-2 blocks per stage, not 24 layers in 4 stages of 6; RGC trained by the sync "
          "executor (equal to async to float rounding at every staleness; docs/rgc.md)"),
    Claim("rgc-tinystories", PAPER, "TinyStories: async RGC more than 2.5 % worse than backprop",
          "paper: > 2.5 % worse", SOURCE, SCALE + ", TinyStories",
          "threshold: reproduced iff our mean relative difference is > +2.5 %", tinystories),
)
