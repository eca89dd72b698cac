"""What the baseline wing registers with the pipeline (:mod:`lmrepro.pipeline.registry`): the
``backprop`` role and the ``train:`` section of the parameter file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmrepro.baseline.roles import ROLE_BACKPROP
from lmrepro.pipeline.registry import (Report, Role, register_report, register_roles,
                                       register_section)

WING = "baseline"

# the RGC suite's backprop executor writes method "backprop" with executor "backprop"
register_roles(WING, Role(ROLE_BACKPROP, "backprop", executors=(None, "backprop")))
register_section(WING, "train", "lmrepro.baseline.config:BaselineSuite",
                 lambda s: [(f"train.corpora[{i}]", c) for i, c in enumerate(s.corpora)])


def scale(params: Mapping[str, Any], n_params: Mapping[str, int]) -> str | None:
    """The baseline's part of the index's scale sentence."""
    train, model = params.get("train") or {}, params.get("model") or {}
    if not train:
        return None
    return (f"baseline: {model.get('n_layers')} layers x d={model.get('d_model')}, "
            f"{train.get('steps')} steps")


register_report(Report(WING, scale, rank=1, metrics=("results/baseline/metrics.json",)))
