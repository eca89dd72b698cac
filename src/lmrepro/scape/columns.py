"""The SCAPE wing's table vocabulary: the columns and presets of the step-time model's tables
(:mod:`lmrepro.scape.steptime_report`, notebook 09), registered with the pipeline by
:mod:`lmrepro.scape.wing` (:func:`lmrepro.pipeline.registry.register_tables`) and read by
:func:`lmrepro.pipeline.tables.column` and :func:`~lmrepro.pipeline.tables.format_table`."""

from __future__ import annotations

from lmrepro.pipeline.tables import (MISSING, MS, PERCENT, SIGNED_PERCENT, Column, integer, sig3,
                                     text)

COLUMNS: dict[str, Column] = {
    "link": Column("link", text, False),
    "role": Column("role", text, False),
    "measured_s": Column("measured median (ms)", MS),
    "measured_iqr_ms": Column("measured IQR (ms)", text, False),
    "blocks_x_steps": Column("blocks x steps", text, False),
    "predicted_s": Column("predicted (ms)", MS),
    "rel_error": Column("error (%)", SIGNED_PERCENT),
    "within_tolerance": Column("within tolerance", text, False),
    "model": Column("model", text, False),
    "config": Column("configuration", text, False),
    "predicted_range": Column("predicted, range of the assumptions", text, False),
    "predicted_default": Column("predicted at 200 Gbit/s, MFU 0.5", text, False),
    "ratio_to_paper": Column("predicted / paper (x)", sig3),
    "required_gbit": Column("network rate giving the paper's figure (Gbit/s per node)", sig3),
    "assumption": Column("assumption", text, False),
    "value": Column("value", text, False),
    "source": Column("source", text, False),
    "inter_node_gbit": Column("network (Gbit/s per node)", sig3),
    "mfu": Column("MFU", lambda x: MISSING if x is None else f"{float(x):g}"),
    "tokens_per_step": Column("tokens per step", integer),
    "dense_step_s": Column("dense step (s)", sig3),
    "scape_step_s": Column("SCAPE step (s)", sig3),
    "wall_saving": Column("wall-clock saving (%)", PERCENT),
    "world": Column("GPUs", integer),
    "dense_efficiency": Column("dense weak-scaling efficiency (%)", PERCENT),
    "scape_efficiency": Column("SCAPE weak-scaling efficiency (%)", PERCENT),
    "speedup_at_200_gbit": Column("speed-up at 200 Gbit/s (x)", sig3),
    "speedup_at_400_gbit": Column("speed-up at 400 Gbit/s (x)", sig3),
    "gbit_for_paper_speedup": Column("network rate for 3.26x (Gbit/s per node)", sig3),
    "break_even_gbit": Column("SCAPE slower above (Gbit/s per node)", sig3),
    # the training-length study (lmrepro.scape.scaling_report.DISPLAY; its shared columns are
    # lmrepro.pipeline.tables')
    "dense_test_bpb": Column("dense (bits/byte, test)", sig3),
    "extrapolated_gap": Column("EXTRAPOLATED gap at 100k steps (%)", SIGNED_PERCENT),
    "extrapolation_low": Column("low (%)", SIGNED_PERCENT),
    "extrapolation_high": Column("high (%)", SIGNED_PERCENT),
    "lack_of_fit_F": Column("lack of fit F", sig3),
    "lack_of_fit_p": Column("lack of fit p", sig3),
    "extrapolated": Column("extrapolated", text, False),
    "candidate_kb_per_step": Column("candidate kB/step", sig3),
    "baseline_kb_per_step": Column("baseline kB/step", sig3),
    "baseline_test_bpb": Column("baseline (bits/byte, test)", sig3),
    "target_bpb": Column("target (bits/byte, test)", sig3),
    "multiplier": Column("steps / dense AdamS's (x)", sig3),
    "multiplier_lower": Column("low (x)", sig3),
    "multiplier_upper": Column("high (x)", sig3),
    "not_reached": Column("seeds not reaching it", integer),
    "dense_steps": Column("dense AdamS steps (mean)", sig3),
    "candidate_steps": Column("candidate steps (mean)", sig3),
    "ablation": Column("ablation", text, False),
    "against": Column("against", text, False),
    "mask_kept": Column("mask kept from the previous step (%)", PERCENT),
    "step_enter": Column("step entering (x lr)", sig3),
    "step_stay": Column("step staying (x lr)", sig3),
    "reentry_gap": Column("steps out before re-entering", sig3),
    "residual_norm": Column("residual norm", sig3),
    "coverage_at_target": Column("ever selected at target sparsity (%)", PERCENT),
}

PRESETS: dict[str, list[str]] = {
    "steptime_calibration": ["link", "n_params", "method", "role", "measured_s",
                             "measured_iqr_ms", "blocks_x_steps", "predicted_s", "rel_error",
                             "within_tolerance"],
    "steptime_headline": ["claim", "config", "paper_figure", "predicted_range",
                          "predicted_default", "ratio_to_paper", "required_gbit"],
    "steptime_paper": ["model", "sparsity", "inter_node_gbit", "mfu", "dense_step_s",
                       "scape_step_s", "speedup", "wall_saving"],
    "steptime_scaling": ["model", "world", "dense_step_s", "scape_step_s", "speedup",
                         "dense_efficiency", "scape_efficiency"],
    "steptime_break_even": ["model", "tokens_per_step", "sparsity", "speedup_at_200_gbit",
                            "speedup_at_400_gbit", "gbit_for_paper_speedup", "break_even_gbit"],
}
