"""What the baseline wing registers with the pipeline (:mod:`lmrepro.pipeline.registry`): the
``backprop`` role and the ``train:`` section of the parameter file."""

from __future__ import annotations

from lmrepro.baseline.roles import ROLE_BACKPROP
from lmrepro.pipeline.registry import Role, register_roles, register_section

WING = "baseline"

# the RGC suite's backprop executor writes method "backprop" with executor "backprop"
register_roles(WING, Role(ROLE_BACKPROP, "backprop", executors=(None, "backprop")))
register_section(WING, "train", "lmrepro.baseline.config:BaselineSuite",
                 lambda s: [(f"train.corpora[{i}]", c) for i, c in enumerate(s.corpora)])
