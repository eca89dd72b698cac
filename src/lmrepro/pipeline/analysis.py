"""The analysis of a training stage: its tables, the non-inferiority tests and ``analysis.json``.

Every function takes ``runs``: a mapping ``run name -> run directory`` (or an already loaded
:class:`~lmrepro.pipeline.runs.Run`) in the layout of :mod:`lmrepro.results`; every figure is
computed from those runs. :func:`analysis_stage` writes a stage's tables, its DVC metric and
:class:`~lmrepro.pipeline.records.AnalysisRecords` (``analysis.json``): everything the claims
stage (:mod:`lmrepro.pipeline.claims`) needs, so it reads figures instead of recomputing them.

This module holds the stage only; its parts live in modules of their own and are imported from
there:

* :mod:`~lmrepro.pipeline.runs`: :class:`~lmrepro.pipeline.runs.Run`, loading, roles
  (:func:`~lmrepro.pipeline.runs.run_role`), configuration keys, labels and scales;
* :mod:`~lmrepro.pipeline.comparisons`: pairing runs by role and seed, the non-inferiority tests
  (:func:`~lmrepro.pipeline.comparisons.run_comparisons`), testability against the n-gram floors,
  their table;
* :mod:`~lmrepro.pipeline.resources`: throughput, memory and communication tables, the timing and
  memory comparisons with their spreads (:func:`~lmrepro.pipeline.resources.resource_comparisons`);
* :mod:`~lmrepro.pipeline.records`: the records of ``analysis.json``
  (:class:`~lmrepro.pipeline.records.AnalysisRecords`) and
  :func:`~lmrepro.pipeline.records.read_analysis`.

The figures are :mod:`lmrepro.pipeline.plots` (which imports the parts, never this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lmrepro.errors import check
from lmrepro.io import atomic_write_json, atomic_write_text
from lmrepro.pipeline import registry
from lmrepro.pipeline.comparisons import (DEFAULT_STATS, ComparisonOutcome, outcomes_table,
                                          run_comparisons)
from lmrepro.pipeline.provenance import cpu_model, usable_cores
from lmrepro.pipeline.records import AnalysisRecords, Machine, RunRecord
from lmrepro.pipeline.resources import (reference_tables, resource_comparisons,
                                        resources_table)
from lmrepro.pipeline.runs import (Runs, config_label, load_runs, loss_spikes, recorded_facts,
                                   run_scale, run_setting)
from lmrepro.results import RunSummary
from lmrepro.rundirs import collect_runs
from lmrepro.stats import StatsConfig

__all__ = ["analysis_records", "analysis_stage", "corpus_floors"]


def analysis_records(runs: Runs, *, stage: str = "", stats: StatsConfig = DEFAULT_STATS,
                     outcomes: Sequence[ComparisonOutcome] | None = None,
                     cores: int | None = None,
                     floors: Mapping[str, Mapping[str, Any]] | None = None,
                     machine: Machine | None = None) -> AnalysisRecords:
    """The records of ``runs``, of ``outcomes`` (default: :func:`run_comparisons` with
    ``stats``; pass the outcomes computed with the same ``stats`` to avoid a second bootstrap)
    and of :func:`resource_comparisons` (``cores``: the machine's, for the oversubscription
    caveat; ``machine``: where the runs ran, for the timing history)."""
    loaded = load_runs(runs)
    if outcomes is None:
        outcomes = run_comparisons(loaded, stats=stats, floors=floors)
    keys = set(RunRecord.model_fields) & set(RunSummary.model_fields)
    return AnalysisRecords(
        stage=stage, stats=stats, cores=cores, floors=dict(floors or {}),
        seeds=sorted({r.summary.seed for r in loaded.values()}),
        comparisons=[o.record for o in outcomes],
        resources=resource_comparisons(loaded, cores, machine),
        runs=[RunRecord(name=r.name, role=r.role, scale=run_scale(r),
                        configuration=config_label(r), setting=run_setting(r),
                        facts=recorded_facts(r),
                        final_test_bpb=r.summary.details.final_test_bpb,
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
    against that corpus's reference role (:func:`lmrepro.pipeline.registry.stages`) and written
    as CSV under ``out_root/<stage>/``, with ``noninferiority.json`` (the stage's DVC metric),
    ``analysis.json`` (:class:`AnalysisRecords`, read by the claims stage) and the figures as PNG
    (DVC image plots). The loss curves draw the n-gram floors of the corpora prepared under
    ``prepared_dir`` when given (:func:`lmrepro.pipeline.plots.ngram_floors`). Returns ``runs``,
    ``tables``, ``outcomes``, ``records``, ``figures`` and ``floors``.
    """
    from lmrepro.pipeline import plots
    from lmrepro.pipeline.headline import comparison_items, metrics_dir, write_headline

    references = registry.stages()
    check(stage in references, "stage", stage, f"must be one of {sorted(references)}")
    runs_dir = Path(results_root) / stage / "runs"
    runs = load_runs(collect_runs(runs_dir))
    if seeds is not None:
        runs = {n: r for n, r in runs.items() if r.summary.seed in set(seeds)}
    if not runs:
        raise FileNotFoundError(f"no finished runs under {runs_dir}"
                                + (f" with seeds {list(seeds)}" if seeds is not None else ""))
    out_dir = Path(out_root) / stage
    frames = reference_tables(runs, *references[stage])
    floors = corpus_floors(prepared_dir, {r.summary.corpus for r in runs.values()})
    outcomes = run_comparisons(runs, stats=stats, floors=floors)
    cores = usable_cores()
    records = analysis_records(runs, stage=stage, stats=stats, outcomes=outcomes, cores=cores,
                               floors=floors, machine=Machine(cpu_model=cpu_model(), cores=cores))
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
    write_headline(metrics_dir(out_dir, stage),
                   comparison_items(records.comparisons))
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
