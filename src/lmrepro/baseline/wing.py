"""What the baseline wing adds to the pipeline (:class:`lmrepro.pipeline.registry.Wing`): the
``backprop`` role and its runs' details, the ``train:`` section of the parameter file, its part
of the index and its subcommand (``lmrepro train``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmrepro.baseline.details import BackpropDetails
from lmrepro.baseline.roles import ROLE_BACKPROP, BaselineMethod
from lmrepro.pipeline.registry import Report, Role, Section, Wing


def scale(params: Mapping[str, Any], n_params: Mapping[str, int]) -> str | None:
    """The baseline's part of the index's scale sentence."""
    train, model = params.get("train") or {}, params.get("model") or {}
    if not train:
        return None
    return (f"baseline: {model.get('n_layers')} layers x d={model.get('d_model')}, "
            f"{train.get('steps')} steps")


WING = Wing(
    "baseline",
    # the baseline stage and the RGC suite's backprop executor write executor "backprop"; the
    # pipelined executor's runs are no role
    roles=(Role(ROLE_BACKPROP, BaselineMethod.BACKPROP.value, by="executor",
                values=(None, "backprop")),),
    section=Section("train", "lmrepro.baseline.config:BaselineSuite",
                    lambda s: [(f"train.corpora[{i}]", c) for i, c in enumerate(s.corpora)]),
    details={BaselineMethod.BACKPROP.value: BackpropDetails},
    report=Report(scale, rank=1, metrics=("results/baseline/metrics.json",)),
    commands=("lmrepro.baseline.cli",),
)
