"""The composition of the package: every wing's registrations with the pipeline.

This module sits above the pipeline and the wings: it imports each wing's ``wing`` module, whose
import registers the wing's roles, pairings, analysis stages, parameter section and claims with
:mod:`lmrepro.pipeline.registry`. The order of the imports is the order of every registered list
(the methods in error messages, the parameter sections, the pairings, the claims table): baseline,
SCAPE, RGC. To add a wing, write its ``wing`` module and import it here.

The pipeline loads this module by name when it first needs the vocabulary
(:func:`lmrepro.pipeline.registry.load_wings`); ``lmrepro.cli`` imports it directly.
"""

from __future__ import annotations

import enum

from lmrepro.baseline.roles import BaselineMethod
from lmrepro.pipeline.registry import load_wings
from lmrepro.rgc.roles import RGCMethod
from lmrepro.scape.roles import ScapeMethod

# isort: off  (the order of registration)
from lmrepro.baseline import wing as baseline_wing
from lmrepro.scape import wing as scape_wing
from lmrepro.rgc import wing as rgc_wing
# isort: on

WINGS = (baseline_wing, scape_wing, rgc_wing)

#: every wing's methods as one enumeration (``lmrepro.results.Method`` reads it from here), in
#: the wings' order: ``Method.SCAPE == "scape"`` (its members are known at run time only)
Method = enum.StrEnum("Method", list({  # type: ignore[misc]
    m.name: m.value for e in (BaselineMethod, ScapeMethod, RGCMethod) for m in e}.items()))

__all__ = ["WINGS", "Method", "load_wings"]
