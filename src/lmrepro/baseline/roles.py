"""The baseline wing's role in the analysis: single-process global backprop (the RGC paper's
foil), declared to the pipeline by :mod:`lmrepro.baseline.wing`."""

import enum


class BaselineMethod(enum.StrEnum):
    """The baseline wing's method, as ``RunSummary.method`` records it."""

    BACKPROP = "backprop"      # single-process global backprop with AdamW (baseline, RGC's foil)


ROLE_BACKPROP = BaselineMethod.BACKPROP.value
