"""What the SCAPE wing adds to the pipeline (:class:`lmrepro.pipeline.registry.Wing`): its roles
(the dense baselines and the sparse methods), which are judged against which, the reference
roles of the ``scape`` analysis, the ``scape:`` section of the parameter file, its setting (the
sparsity) and byte kinds, its claims, table columns, part of the index and subcommands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmrepro.pipeline.registry import Report, Role, Section, Wing, parameter_count
from lmrepro.scape.details import ScapeDetails
from lmrepro.scape.roles import (ROLE_ADAMS, ROLE_ADAMW, ROLE_SCAPE, ROLE_SCAPE_STALE_M,
                                 ROLE_TOPK, ROLE_TOPK_ADAMW, SPARSE, ScapeMethod)


def scale(params: Mapping[str, Any], n_params: Mapping[str, int]) -> str | None:
    """The SCAPE suite's part of the index's scale sentence."""
    scape = params.get("scape") or {}
    if not scape:
        return None
    m = scape.get("model") or params.get("model") or {}
    return (f"SCAPE suite: {len(scape.get('runs') or [])} runs of a "
            f"{m.get('n_layers')}-layer, d={m.get('d_model')} model"
            f"{parameter_count(n_params, 'scape')}, {scape.get('steps')} steps, "
            f"{scape.get('world_size')} workers, on {scape.get('corpus')}")


# a sparse method's label shows its sparsity (ScapeDetails), e.g. scape@90%
SPARSE_LABEL = (("@{:.0%}", "sparsity"),)


WING = Wing(
    "scape",
    roles=tuple(Role(name, name, data_parallel=True,
                     label_details=SPARSE_LABEL if name in SPARSE else ())
                for name in (ROLE_ADAMW, ROLE_ADAMS, ROLE_SCAPE, ROLE_SCAPE_STALE_M,
                             ROLE_TOPK, ROLE_TOPK_ADAMW)),
    # docs/statistics.md: "The same test judges SCAPE vs dense AdamW/AdamS"
    pairings=((ROLE_SCAPE, ROLE_ADAMW), (ROLE_SCAPE, ROLE_ADAMS),
              (ROLE_SCAPE_STALE_M, ROLE_ADAMW), (ROLE_SCAPE_STALE_M, ROLE_ADAMS),
              (ROLE_TOPK, ROLE_ADAMW), (ROLE_TOPK, ROLE_ADAMS), (ROLE_TOPK_ADAMW, ROLE_ADAMW)),
    analyses={"scape": (ROLE_ADAMW, ROLE_ADAMS)},
    # the training-length study (lmrepro scaling): its verdict point feeds the claims
    records=("scaling",),
    section=Section("scape", "lmrepro.scape.config:ScapeSuite",
                    lambda s: [("scape.corpus", s.corpus)]),
    details={m.value: ScapeDetails for m in ScapeMethod},
    # configurations of one method differ in their sparsity (dense methods: 0)
    setting="sparsity",
    # what the optimizers hand to collectives (lmrepro.optim.comm)
    byte_kinds={"grad_values": "gradient values", "param_values": "parameter values",
                "mask": "mask"},
    # what the claims read of a run besides its records' common fields (sent_fraction)
    run_facts=("mean_sparsity",),
    claims="lmrepro.scape.claims",
    tables="lmrepro.scape.columns",
    report=Report(scale, metrics=("results/scape/metrics.json",),
                  analyses=("results/analysis/scape/analysis.json",),
                  extra=("results/steptime/predictions.json",),
                  published=("results/steptime/*.json", "results/steptime/*.csv",
                             "results/steptime/*.png",
                             # the worker-count study (lmrepro.scape.study.workers): its runs'
                             # summaries, per-batch losses and jobs, the sweep, the analysis
                             *(f"results/scaling/workers/{kind}/**/{name}"
                               for kind in ("runs", "sweep")
                               for name in ("summary.json", "eval_losses.json",
                                            "eval_losses_test.json", "job.json")),
                             "results/scaling/workers/sweep/sweep.json",
                             "results/analysis/scaling/workers/*.csv",
                             "results/analysis/scaling/workers/*.png",
                             "results/analysis/scaling/workers/*.txt"),
                  headline="lmrepro.scape.steptime.report:headline_from_run"),
    commands=("lmrepro.scape.cli", "lmrepro.scape.steptime.predict_cli",
              "lmrepro.scape.authors.logs"),
    doc_sections=("lmrepro.scape.analysis.report", "lmrepro.scape.study.review",
                  "lmrepro.scape.study.mechanism_review", "lmrepro.scape.study.workers_review"),
)
