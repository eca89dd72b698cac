"""The composition of the package: the list of the wings, each the one value its ``wing``
module declares (:class:`lmrepro.pipeline.registry.Wing`).

This module sits above the pipeline and the wings, and nothing below imports it: the program that
runs the pipeline (the ``lmrepro`` command, a notebook's first cell, the tests) hands
:data:`WINGS` to :func:`lmrepro.pipeline.registry.install`. The order of the list is the order of
every list the pipeline reads (the methods in error messages, the parameter sections, the
pairings, the claims table): baseline, SCAPE, RGC. To add a wing, write its package with its
``wing`` module and add its ``WING`` here.
"""

from __future__ import annotations

import enum

from lmrepro.baseline.roles import BaselineMethod
from lmrepro.baseline.wing import WING as BASELINE
from lmrepro.pipeline.registry import Wing
from lmrepro.rgc.roles import RGCMethod
from lmrepro.rgc.wing import WING as RGC
from lmrepro.scape.roles import ScapeMethod
from lmrepro.scape.wing import WING as SCAPE

WINGS: tuple[Wing, ...] = (BASELINE, SCAPE, RGC)

#: every wing's methods as one enumeration, in the wings' order: ``Method.SCAPE == "scape"``
#: (its members are known at run time only)
Method = enum.StrEnum("Method", list({  # type: ignore[misc]
    m.name: m.value for e in (BaselineMethod, ScapeMethod, RGCMethod) for m in e}.items()))

__all__ = ["WINGS", "Method"]
