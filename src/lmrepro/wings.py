"""The composition of the package: the list of the wings, each the one value its ``wing``
module declares (:class:`lmrepro.pipeline.registry.Wing`).

This module sits above the pipeline and the wings, and nothing below imports it: the program that
runs the pipeline (the ``lmrepro`` command, a notebook's first cell, the tests) hands
:data:`WINGS` to :func:`lmrepro.pipeline.registry.install`. The order of the list is the order of
every list the pipeline reads (the methods in error messages, the parameter sections, the
pairings, the claims table): baseline, SCAPE, RGC. To add a wing, write its package with its
``wing`` module and add that module's name to :data:`WING_MODULES`.
"""

from __future__ import annotations

import enum
import importlib

from lmrepro.pipeline.registry import Wing

#: the module of each wing's ``WING``, in the pipeline's order
WING_MODULES = ("lmrepro.baseline.wing", "lmrepro.scape.wing", "lmrepro.rgc.wing")

WINGS: tuple[Wing, ...] = tuple(importlib.import_module(m).WING for m in WING_MODULES)

#: every wing's methods (those whose runs it reads, ``Wing.details``) as one enumeration, in
#: the wings' order: ``Method.SCAPE == "scape"`` (its members are known at run time only)
Method = enum.StrEnum("Method", [  # type: ignore[misc]
    (method.upper(), method) for method in dict.fromkeys(m for w in WINGS for m in w.details)])

__all__ = ["WINGS", "WING_MODULES", "Method"]
