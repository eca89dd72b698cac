"""The step-time model's report (``notebooks/09_steptime.ipynb``, the ``steptime`` stage): small
functions returning the tables (DataFrames) and the figure the page shows, and
:func:`steptime_stage`, which computes them all and writes them to ``results/steptime/``.

* the calibration on our shaped link (:mod:`lmrepro.scape.steptime.fit`): predicted against
  measured step times with their spread, from ``bench/results/scape_calibration.json`` or, until
  that run exists, the development check on ``bench/results/scape_netns.json``;
* the paper's configurations (:mod:`lmrepro.scape.steptime.paper`): predicted per-step speedup
  and whole-run wall-clock saving beside the paper's 3.26x and 43.3 %, the assumptions, and the
  network rate that would give the paper's figures;
* weak scaling from 8 to 32 and 128 GPUs;
* predicted speedup against the network rate for several models at two sparsities.

Everything is a prediction of the model (docs/steptime.md), not a measurement; it runs in a
second on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lmrepro.bench import BENCH_RESULTS
from lmrepro.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from lmrepro.pipeline.headline import metrics_dir, rounded, write_headline
from lmrepro.scape.steptime import paper as sp
from lmrepro.scape.steptime.model import Cluster, Options, bandwidth_for_speedup, predict
from lmrepro.scape.steptime.fit import calibrate

OUT_DIR = "results/steptime"
CALIBRATION = "scape_calibration.json"     # bench_scape_netns.py --calibrate
DEVELOPMENT = "scape_netns.json"           # the older sweep: the development check
CALIBRATE_CMD = "sudo python bench/bench_scape_netns.py --calibrate"

#: a reference model outside the paper, for the plot: Llama-2-7B's shape (32 x 4096, FFN 11008,
#: 32 heads, no grouped KV, vocab 32000) at its 4M-token global batch of 4096-token sequences
#: (Touvron et al. 2023, "Llama 2", Table 1 and section 2.2)
LLAMA2_7B = sp.PaperModel("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000,
                          4096, 1024)
PLOT_MODELS = (*sp.MODELS, LLAMA2_7B)
PLOT_SPARSITIES = (0.9, 0.99)
#: network rates of the plot, Gbit/s per node (log-spaced, past the break-even near 10 Tbit/s)
PLOT_GBITS = tuple(float(g) for g in np.geomspace(1.0, 20000.0, 61))

#: the files the stage writes under ``out_dir``
OUTPUTS = ("predictions.json", "calibration.csv", "paper_table.csv", "scaling.csv",
           "speedup_vs_bandwidth.csv", "speedup_vs_bandwidth.png")


def _percent(x: float) -> str:
    """A fraction as the papers write it: ``0.99`` -> ``99 %`` (``1 - 0.99`` -> ``1 %``)."""
    return f"{round(100 * x, 6):g} %"


def _billions(model: sp.PaperModel) -> str:
    """``name (size)``, the size counted from the shapes; a model outside the paper marked."""
    mark = "" if model in sp.MODELS else ", not in the paper"
    return f"{model.name} ({model.params()[0] / 1e9:.2g}B{mark})"


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------


def load_calibration(bench_dir: str | Path = BENCH_RESULTS) -> dict[str, Any] | None:
    """The model's calibration (:func:`~lmrepro.scape.steptime.fit.calibrate`) on the
    calibration run when it exists, else on the older sweep (the development check), with
    ``source`` (the file) and ``calibrated`` (whether it is the calibration run); None when
    neither file exists."""
    bench = Path(bench_dir)
    for name, calibrated in ((CALIBRATION, True), (DEVELOPMENT, False)):
        path = bench / name
        if path.is_file():
            cal = calibrate(read_json(path))
            return {**cal, "source": str(path), "calibrated": calibrated}
    return None


def calibration_note(cal: dict[str, Any] | None) -> str:
    """What the calibration table is (Markdown): calibrated, or "not yet calibrated" and the
    development check; the fit and held-out links and whether the held-out points pass."""
    cmd = f"`{CALIBRATE_CMD}`"
    if cal is None:
        return (f"**Not yet calibrated**, and no benchmark result to check the model on: "
                f"neither `{BENCH_RESULTS}/{CALIBRATION}` nor `{BENCH_RESULTS}/{DEVELOPMENT}` "
                f"exists. Run {cmd} (about 10 min on 2 cores, on a quiet machine).")
    if cal["calibrated"]:
        head = f"Calibrated on `{cal['source']}`."
    else:
        head = (f"**Not yet calibrated**: `{BENCH_RESULTS}/{CALIBRATION}` does not exist (run "
                f"{cmd}, about 10 min on 2 cores, on a quiet machine). Below is the development "
                f"check on the older sweep `{cal['source']}` (fewer links and timed steps).")
    err = cal["held_out_max_abs_error"]
    verdict = ("no held-out point" if err is None else
               f"every held-out point within {cal['tolerance']:.0%}: "
               f"{'yes' if cal['held_out_pass'] else '**no**'} (largest error {err:.1%})")
    sizes = sorted({r["n_params"] for r in cal["rows"]})
    models = " and ".join(f"{n / 1e6:.2g} M" for n in sizes)
    return (f"{head} Fitted on the links {', '.join(cal['fit_links'])}; held out: "
            f"{', '.join(cal['held_out_links']) or 'none'}; {verdict}. Measured: the median "
            "step over the timed blocks with its interquartile range (2 gloo workers on one "
            f"rate-limited loopback; models of {models} parameters).")


def calibration_frame(cal: dict[str, Any] | None) -> pd.DataFrame:
    """One row per (link, model, method): measured median with its interquartile range and
    blocks x steps, predicted, relative error, within the tolerance."""
    cols = ["link", "n_params", "method", "role", "measured_s", "measured_iqr_ms",
            "blocks_x_steps", "predicted_s", "rel_error", "within_tolerance"]
    if cal is None:
        return pd.DataFrame(columns=cols)
    rows = []
    for r in cal["rows"]:
        per_block = r["timed_steps"] // max(1, r["blocks"])
        rows.append({**r, "measured_iqr_ms": f"{r['q1_s'] * 1e3:.1f}-{r['q3_s'] * 1e3:.1f}",
                     "blocks_x_steps": f"{r['blocks']} x {per_block}",
                     "within_tolerance": "yes" if r["within_tolerance"] else "no"})
    return pd.DataFrame(rows)[cols]


# ---------------------------------------------------------------------------------------------
# The paper's configurations
# ---------------------------------------------------------------------------------------------


def paper_frame() -> pd.DataFrame:
    """:func:`~lmrepro.scape.steptime.paper.paper_table`: every model, sparsity, network rate
    and MFU."""
    return pd.DataFrame(sp.paper_table())


def headline_frame(table: pd.DataFrame | None = None) -> pd.DataFrame:
    """The paper's two figures beside the predictions: the range over the assumptions, the
    value at the defaults (200 Gbit/s, MFU 0.5) and the network rate at which the model gives
    the paper's figure."""
    t = paper_frame() if table is None else table
    out = []
    for model, key, paper, text, need in (
            (sp.LLAMA_1_8B, "speedup", sp.PAPER_STEP_SPEEDUP,
             f"{sp.PAPER_STEP_SPEEDUP}x", sp.required_bandwidth(sp.LLAMA_1_8B,
                                                                 sp.PAPER_STEP_SPEEDUP)),
            (sp.LLAMA_500M, "wall_saving", sp.PAPER_WALL_SAVING,
             f"{sp.PAPER_WALL_SAVING:.1%}",
             sp.required_bandwidth_for_saving(sp.LLAMA_500M, sp.PAPER_WALL_SAVING))):
        rows = t[(t.model == model.name) & (t.sparsity == model.sparsity)]
        mid = rows[(rows.inter_node_gbit == sp.INTER_GBIT_RANGE[0])
                   & (rows.mfu == sp.DEFAULT_MFU)][key].iloc[0]
        lo, hi = rows[key].min(), rows[key].max()

        def fmt(v: float, key: str = key) -> str:
            return f"{v:.2f}x" if key == "speedup" else f"{v:.1%}"

        claim = ("per-step speedup over dense AdamS" if key == "speedup" else
                 f"wall-clock saving over {model.total_steps:,} iterations "
                 f"({model.dense_steps:,} dense, {model.ramp_steps:,} sparsity warm-up)")
        out.append({"claim": claim,
                    "config": f"{_billions(model)}, {_percent(model.sparsity)} sparsity, "
                              f"{sp.PAPER_WORLD} GH200",
                    "paper_figure": text, "predicted_range": f"{fmt(lo)} to {fmt(hi)}",
                    "predicted_default": fmt(mid),
                    "ratio_to_paper": mid / paper,
                    "required_gbit": need})
    return pd.DataFrame(out)


def assumptions_frame() -> pd.DataFrame:
    """The assumptions behind the paper-scale rows, each with its source."""
    c = Cluster()
    lo, hi = sp.INTER_GBIT_RANGE
    rows = [
        ("GPUs", f"{sp.PAPER_WORLD}, one GH200 per node", "the paper; TACC Vista's GH200 nodes "
         "(Cornell Virtual Workshop); the authors' Llama-1.8B script sets one GPU per node"),
        ("network rate per node", f"{lo:g} to {hi:g} Gbit/s (default {lo:g})",
         "NDR InfiniBand (NDR200 to NDR400); Vista's per-node rate is not published"),
        ("network latency", f"{c.inter.alpha_s * 1e6:g} us per message", "assumption"),
        ("peak compute", f"{c.peak_flops / 1e12:g} TFLOP/s dense BF16",
         "NVIDIA GH200 datasheet (1 979 with sparsity)"),
        ("model FLOP utilisation", f"{sp.MFU_RANGE[0]:g} to {sp.MFU_RANGE[1]:g} "
         f"(default {sp.DEFAULT_MFU:g})", "assumption"),
        ("FLOPs per token", "6 N + 12 L d s", "Megatron-LM's count"),
        ("HBM bandwidth (local optimizer work)", f"{c.hbm_bytes_per_s / 1e12:g} TB/s",
         "NVIDIA GH200 datasheet"),
        ("dense reduction", "ring all-reduce of fp32 gradients, not overlapped",
         "the authors' flags: --accumulate-allreduce-grads-in-fp32, no --overlap-grad-reduce"),
        ("SCAPE's communication", "fp32 values all-reduced; the next mask's all-gather "
         "overlapped with the forward/backward", "docs/scape.md"),
        ("models, batches, sequence lengths, warm-up", ", ".join(
            f"{m.name} {m.global_batch} x {m.seq}" for m in sp.MODELS),
         "the authors' launch scripts (mz687/SCAPE_SC26, slurm_scripts/vista/)"),
        ("not modelled", "congestion and the two switch tiers, stragglers, kernel launch and "
         "framework overheads, data loading", "the model is an alpha-beta lower bound on "
         "communication"),
    ]
    return pd.DataFrame(rows, columns=["assumption", "value", "source"])


def scaling_frame(models: Sequence[sp.PaperModel] = (sp.LLAMA_500M, sp.LLAMA_1_8B),
                  gbit: float = sp.INTER_GBIT_RANGE[0], mfu: float = sp.DEFAULT_MFU
                  ) -> pd.DataFrame:
    """Weak scaling 8 -> 32 -> 128 GPUs (the per-GPU batch of the paper's 32 GPUs kept), dense
    and SCAPE, per model."""
    rows = []
    for m in models:
        for r in sp.scaling_table(m, gbit, mfu):
            rows.append({"model": _billions(m), "sparsity": m.sparsity, "inter_node_gbit": gbit,
                         "mfu": mfu, **r})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Speedup against the network rate
# ---------------------------------------------------------------------------------------------


def _cluster_at(gbit: float, mfu: float) -> Cluster:
    return sp.paper_cluster(gbit, mfu)


def speedup_curves(models: Sequence[sp.PaperModel] = PLOT_MODELS,
                   sparsities: Sequence[float] = PLOT_SPARSITIES,
                   gbits: Sequence[float] = PLOT_GBITS, mfu: float = sp.DEFAULT_MFU
                   ) -> pd.DataFrame:
    """Predicted speedup per model (its own batch and sequence length), sparsity and network
    rate, on the paper's machine (32 GPUs, one per node)."""
    rows = []
    for m in models:
        w = m.workload()
        for s in sparsities:
            o = Options(sparsity=s)
            for g in gbits:
                r = predict(w, _cluster_at(g, mfu), o)
                rows.append({"model": _billions(m), "in_paper": m in sp.MODELS,
                             "params": m.params()[0],
                             "tokens_per_step": w.tokens_per_step, "sparsity": s,
                             "inter_node_gbit": g, "mfu": mfu, "speedup": r["speedup"]})
    return pd.DataFrame(rows)


def break_even_frame(models: Sequence[sp.PaperModel] = PLOT_MODELS,
                     sparsities: Sequence[float] = PLOT_SPARSITIES,
                     mfu: float = sp.DEFAULT_MFU) -> pd.DataFrame:
    """Per model and sparsity: the network rate above which SCAPE is slower than dense
    (speedup 1), the rate at which it gives the paper's 3.26x, and the speedup at 200 and
    400 Gbit/s."""
    rows = []
    for m in models:
        w = m.workload()
        for s in sparsities:
            o = Options(sparsity=s)
            c = _cluster_at(sp.INTER_GBIT_RANGE[0], mfu)
            row: dict[str, Any] = {"model": _billions(m), "tokens_per_step": w.tokens_per_step,
                                   "sparsity": s}
            for g in sp.INTER_GBIT_RANGE:
                row[f"speedup_at_{g:g}_gbit"] = predict(w, _cluster_at(g, mfu), o)["speedup"]
            row["gbit_for_paper_speedup"] = bandwidth_for_speedup(sp.PAPER_STEP_SPEEDUP, w, c, o)
            row["break_even_gbit"] = bandwidth_for_speedup(1.0, w, c, o)
            rows.append(row)
    return pd.DataFrame(rows)


def plot_speedup_vs_bandwidth(curves: pd.DataFrame | None = None) -> Figure:
    """Predicted speedup (dense / SCAPE step) against the network rate per node (log axis), one
    panel per sparsity, one line per model; speedup 1 (SCAPE stops paying), the paper's 3.26x,
    the NDR range assumed for Vista and the rate at which Llama-1.8B gives 3.26x marked."""
    df = speedup_curves() if curves is None else curves
    sparsities = sorted(df.sparsity.unique())
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    axes = fig.subplots(1, len(sparsities), sharey=True, squeeze=False)[0]
    colors = dict(zip(df.model.unique(), ("C0", "C1", "C2", "C3", "C4", "C5"), strict=False))
    lo, hi = sp.INTER_GBIT_RANGE
    for ax, s in zip(axes, sparsities, strict=True):
        ax.axvspan(lo, hi, color="0.85", zorder=0,
                   label=f"NDR range assumed for Vista ({lo:g}-{hi:g} Gbit/s)")
        for model, g in df[df.sparsity == s].groupby("model", sort=False):
            ls = "-" if g.get("in_paper", pd.Series([True])).iloc[0] else "-."
            ax.plot(g.inter_node_gbit, g.speedup, color=colors[model], lw=1.8, ls=ls,
                    label=model)
        # the labels sit where no curve runs: speedup 1 on the left (slow networks, large
        # speedups), the paper's figure on the right (fast networks, small speedups)
        ax.axhline(1.0, color="black", lw=1.2)
        ax.text(df.inter_node_gbit.min(), 1.0, " speedup 1: SCAPE stops paying",
                ha="left", va="bottom", fontsize=8.5)
        ax.axhline(sp.PAPER_STEP_SPEEDUP, color="black", ls="--", lw=1)
        ax.text(df.inter_node_gbit.max(), sp.PAPER_STEP_SPEEDUP,
                f"paper: {sp.PAPER_STEP_SPEEDUP}x\n(Llama-1.8B, "
                f"{_percent(sp.LLAMA_1_8B.sparsity)} sparsity) ",
                ha="right", va="bottom", fontsize=8.5)
        if math.isclose(s, sp.LLAMA_1_8B.sparsity):
            need = sp.required_bandwidth(sp.LLAMA_1_8B, sp.PAPER_STEP_SPEEDUP)
            if need is not None:
                ax.plot([need], [sp.PAPER_STEP_SPEEDUP], marker="*", ms=14, color="C2",
                        mec="black", ls="none", zorder=5,
                        label=f"Llama-1.8B reaches {sp.PAPER_STEP_SPEEDUP}x at "
                              f"{need:.0f} Gbit/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("network rate per node (Gbit/s, log scale)")
        ax.set_title(f"{_percent(s)} sparsity ({_percent(1 - s)} of the coordinates sent)")
        ax.grid(True, which="major", alpha=0.4)
    ymax = max(df.speedup.max(), sp.PAPER_STEP_SPEEDUP) * 1.2
    axes[0].set_ylim(0.8, ymax)
    ticks = [t for t in (0.8, 1, 1.5, 2, 3, 5, 10, 20, 50, 100) if t <= ymax]
    axes[0].set_yticks(ticks, [f"{t:g}" for t in ticks])
    axes[0].yaxis.minorticks_off()
    axes[0].set_ylabel("predicted speedup, dense / SCAPE step (x)")
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8.5, frameon=False)
    fig.suptitle(f"Predicted per-step speedup of SCAPE against the network rate "
                 f"({sp.PAPER_WORLD} GH200, one per node, MFU {sp.DEFAULT_MFU:g})")
    return fig


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in r.items()} for r in df.astype(object).to_dict(orient="records")]


def save_png(fig: Figure, path: Path) -> None:
    """``fig`` as a PNG at ``path``, without the software stamp in its metadata."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())


def steptime_stage(bench_dir: str | Path = BENCH_RESULTS, out_dir: str | Path = OUT_DIR
                   ) -> dict[str, Any]:
    """Every table and the figure of the page; written to ``out_dir`` (:data:`OUTPUTS`):
    ``predictions.json`` (everything), one CSV per table, the plot as PNG."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cal = load_calibration(bench_dir)
    paper = paper_frame()
    tables = {"calibration": calibration_frame(cal), "paper": paper,
              "headline": headline_frame(paper), "assumptions": assumptions_frame(),
              "scaling": scaling_frame(), "break_even": break_even_frame()}
    curves = speedup_curves()
    fig = plot_speedup_vs_bandwidth(curves)
    summary = None if cal is None else {k: v for k, v in cal.items() if k != "rows"}
    atomic_write_json(out / "predictions.json", {
        "note": "predictions of the step-time model (docs/steptime.md), not measurements",
        "calibration": summary, "calibration_rows": _records(tables["calibration"]),
        "paper_figures": {"step_speedup": sp.PAPER_STEP_SPEEDUP,
                          "wall_saving": sp.PAPER_WALL_SAVING, "world": sp.PAPER_WORLD},
        "headline": _records(tables["headline"]), "assumptions": _records(tables["assumptions"]),
        "paper_table": _records(paper), "scaling": _records(tables["scaling"]),
        "break_even": _records(tables["break_even"]),
        "speedup_vs_bandwidth": _records(curves)})
    for name, df in (("calibration", tables["calibration"]), ("paper_table", paper),
                     ("scaling", tables["scaling"]), ("speedup_vs_bandwidth", curves)):
        atomic_write_text(out / f"{name}.csv", df.to_csv(index=False))
    save_png(fig, out / "speedup_vs_bandwidth.png")
    write_headline(metrics_dir(out, "steptime"),
                   prediction_items(_records(tables["headline"])))
    return {"calibration": cal, "calibration_note": calibration_note(cal), "tables": tables,
            "curves": curves, "figures": {"speedup_vs_bandwidth": fig}}


def prediction_items(headline: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The step-time model's headline (``predictions.json``'s ``headline`` records): each
    predicted figure at the default assumptions (a ratio; a fraction for a saving), and that
    figure over the paper's (``...-of-paper``)."""
    def parse(text: Any) -> float:
        text = str(text).strip()
        return float(text[:-1]) / 100 if text.endswith("%") else float(text.rstrip("x"))

    out = {}
    for row in headline:
        name = "wall-clock-saving" if "wall-clock" in str(row["claim"]) else "step-speedup"
        out[name] = {"value": rounded(parse(row["predicted_default"]), 3)}
        out[f"{name}-of-paper"] = {"value": rounded(row["ratio_to_paper"], 3)}
    return out


def headline_from_run(results: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """The ``steptime`` headline items of a finished run's ``results/`` folder (none when it has
    no step-time predictions): the SCAPE wing's ``Report.headline``."""
    path = Path(results) / "steptime" / "predictions.json"
    return {"steptime": prediction_items(read_json(path)["headline"])} if path.is_file() else {}


def paper_table_view(paper: pd.DataFrame, mfu: float = sp.DEFAULT_MFU) -> pd.DataFrame:
    """The paper table at one MFU (the CSV keeps every MFU), models labelled with their size."""
    names = {m.name: _billions(m) for m in sp.MODELS}
    t = paper[paper.mfu == mfu].copy()
    t["model"] = t.model.map(names)
    return t[["model", "sparsity", "inter_node_gbit", "mfu", "dense_step_s", "scape_step_s",
              "speedup", "wall_saving"]]


__all__ = ["LLAMA2_7B", "OUTPUTS", "assumptions_frame", "break_even_frame", "calibration_frame",
           "calibration_note", "headline_frame", "headline_from_run", "load_calibration",
           "paper_frame", "paper_table_view", "plot_speedup_vs_bandwidth", "prediction_items",
           "scaling_frame", "speedup_curves", "steptime_stage"]
