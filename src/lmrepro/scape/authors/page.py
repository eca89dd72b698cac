"""The page section "What the authors' logs measured" (``notebooks/09_steptime.ipynb``): the
tables of :func:`lmrepro.scape.authors.report.evidence` and the figure of step time against the
density sent, written by :func:`authors_stage` to ``results/steptime/`` (:data:`OUTPUTS`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from lmrepro.scape.authors.report import MODEL, WORLD, evidence, support_frame

#: the files :func:`authors_stage` writes
OUTPUTS = ("authors_step_times.csv", "authors_speedups.csv", "authors_loss.csv",
           "authors_coverage.csv", "authors_fit.csv", "authors_paper.csv", "authors_support.csv",
           "authors_allocations.csv", "authors_validation.csv",
           "authors_logs.json", "authors_step_vs_density.png")


def plot_step_vs_density(ev: dict[str, Any]):  # -> matplotlib Figure
    """Measured SCAPE step times (median and IQR per band) against the density sent, the
    fitted model's line (per-parameter overhead) and the dense AdamS median, 32 ranks."""
    import numpy as np
    from matplotlib.figure import Figure

    from lmrepro.scape.steptime.model import Options, predict

    st = ev["step_times"]
    s = st[(st.method == "scape") & (st.world_size == WORLD) & (st.phase != "dense phase")]
    d = np.linspace(0.05, 1.0, 60)
    f = ev["fit"]
    model = [predict(MODEL.workload(), f.cluster(), Options(sparsity=1 - x),
                     f.local())["scape_step_s"] for x in d]
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = fig.subplots()
    ax.errorbar(s.density, s.median_s, yerr=[s.median_s - s.q1_s, s.q3_s - s.median_s],
                fmt="o", color="C0", capsize=3,
                label="SCAPE, authors' logs (median, IQR; density ~1 fits the overhead, the "
                "rest is held out)")
    ax.plot(d, model, color="C1", label=f"model fitted to the dense steps + overhead "
            f"(MFU {f.mfu:.2f}, {f.gbit:.0f} Gbit/s)")
    dense = ev["speedup"]["dense_s"]
    ax.axhline(dense, color="black", ls="--", lw=1, label=f"dense AdamS, logs ({dense:.2f} s)")
    ax.set_xlabel("fraction of the coordinates sent (density)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{MODEL.name}, {WORLD} GH200: step time against the density sent")
    ax.grid(alpha=0.4)
    ax.legend(fontsize=8.5, loc="upper left")
    return fig


def short_run(run: str) -> str:
    """A run's job number (the log's name ends with it), marked when it ran without clipping;
    a log without one keeps its name."""
    job = run.rsplit("_", 1)[-1]
    name = job if job.isdigit() else run
    return f"{name} (no clip)" if "no_clip_grad" in run else name


def display_tables(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The tables as the page shows them: runs named by their job number."""
    out = {}
    for name, df in tables.items():
        df = df.copy()
        for col in ("run", "dense_run", "scape_run"):
            if col in df:
                df[col] = df[col].map(short_run)
        out[name] = df
    return out


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
            for r in df.astype(object).to_dict(orient="records")]


def authors_stage(out_dir: str | Path = "results/steptime") -> dict[str, Any]:
    """The section's tables and figure, written to ``out_dir`` (:data:`OUTPUTS`)."""
    from lmrepro.io import atomic_write_json, atomic_write_text
    from lmrepro.scape.steptime.report import save_png

    ev = evidence()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = {"step_times": ev["step_times"], "speedups": ev["speedups"], "loss": ev["loss"],
              "coverage": ev["coverage"], "fit": ev["held_out"], "paper": ev["paper"],
              "support": support_frame(ev), "allocations": ev["allocations"],
              "validation": ev["validation"]}
    for name, df in tables.items():
        atomic_write_text(out / f"authors_{name}.csv", df.to_csv(index=False))
    fig = plot_step_vs_density(ev)
    save_png(fig, out / "authors_step_vs_density.png")
    atomic_write_json(out / "authors_logs.json", {
        "note": "measured in the SCAPE authors' own logs (src/lmrepro/scape/data), and the "
                "step-time model fitted to them",
        "measured_speedup": ev["speedup"], "wall_from_logs": ev["wall_logs"],
        "allocation_spread": ev["allocation_spread"],
        "validated_error": list(ev["validated_error"]),
        "fit": {k: v for k, v in ev["fit_summary"].items()}, "needed_gbit": ev["needed"],
        "dense_step_s_by_world": ev["dense_scaling"], "paper": _records(ev["paper"])})
    return {"tables": tables, "figure": fig, "evidence": ev}
