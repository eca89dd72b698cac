"""What the RGC wing adds to the pipeline (:class:`lmrepro.pipeline.registry.Wing`): its roles
(method ``rgc`` split by executor), their comparison with global backprop, the reference role of
the ``rgc`` analysis, the ``rgc:`` section of the parameter file, its claims, table columns, part
of the index and subcommands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmrepro.pipeline.registry import Report, Role, Section, Wing, parameter_count
from lmrepro.rgc.details import RGCDetails
from lmrepro.rgc.roles import METHOD_RGC, ROLE_BACKPROP, ROLE_RGC_ASYNC, ROLE_RGC_SYNC

# labels show the executor, the horizon H and the consensus staleness s (RGCDetails), e.g.
# rgc-async H=2 s=1
LABEL_DETAILS = (("-{}", "executor"), (" H={}", "horizon"), (" s={}", "consensus_staleness"))


def scale(params: Mapping[str, Any], n_params: Mapping[str, int]) -> str | None:
    """The RGC suite's part of the index's scale sentence."""
    rgc = params.get("rgc") or {}
    if not rgc:
        return None
    # rgc.model, or the flat keys of the published runs' older resolved parameters
    model = rgc.get("model") or rgc
    suite = (f"RGC suite: {model.get('n_layers')} layers x d={model.get('d_model')} in "
             f"{rgc.get('n_stages')} stages{parameter_count(n_params, 'rgc')}, "
             f"{rgc.get('steps')} steps, executors {', '.join(rgc.get('executors') or [])}, on "
             f"{', '.join(rgc.get('corpora') or [])}")
    study = rgc.get("scaling")
    if not study:
        return suite
    lengths = "; ".join(f"{size} at {', '.join(map(str, ls))} steps"
                        for size, ls in (study.get("lengths") or {}).items())
    return (f"{suite}; RGC training-length study: {', '.join(r['name'] for r in study['runs'])}"
            f" at {lengths}, verdict at {study.get('verdict_size')} with "
            f"{len(study.get('verdict_seeds') or [])} seeds")


WING = Wing(
    "rgc",
    # method rgc's runs are a role by their executor (a run without one is refused)
    roles=(Role(ROLE_RGC_ASYNC, METHOD_RGC, by="executor", values=("async",),
                label_details=LABEL_DETAILS),
           Role(ROLE_RGC_SYNC, METHOD_RGC, by="executor", values=("sync",),
                label_details=LABEL_DETAILS)),
    # docs/statistics.md: "... and RGC vs global backprop"
    pairings=((ROLE_RGC_ASYNC, ROLE_BACKPROP), (ROLE_RGC_SYNC, ROLE_BACKPROP)),
    # the rgc-throughput claim's pairing: pooled over the sessions of the timing history
    timed=((ROLE_RGC_ASYNC, ROLE_BACKPROP),),
    analyses={"rgc": (ROLE_BACKPROP, None)},
    # the training-length study (lmrepro rgc-scaling): its verdict point feeds the claims
    records=("rgc_scaling",),
    # two settings as older runs of this wing record them: old name -> current
    renamed_settings={"threads_per_worker": "threads", "worker_timeout_s": "timeout_s"},
    section=Section("rgc", "lmrepro.rgc.config:RGCSuite",
                    lambda s: [(f"rgc.corpora[{i}]", c) for i, c in enumerate(s.corpora)]),
    details={METHOD_RGC: RGCDetails},
    claims="lmrepro.rgc.claims",
    tables="lmrepro.rgc.columns",
    report=Report(scale, metrics=("results/rgc/metrics.json",),
                  analyses=("results/analysis/rgc/analysis.json",)),
    commands=("lmrepro.rgc.cli",),
)
