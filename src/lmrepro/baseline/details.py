"""The facts a global-backprop run records beyond the common run record
(``RunSummary.details``), declared for method ``backprop`` by :mod:`lmrepro.baseline.wing`."""

from __future__ import annotations

from lmrepro.results import RunDetails


class BackpropDetails(RunDetails):
    """Written by :mod:`lmrepro.baseline.trainer` and by the RGC suite's backprop executors
    (which record their RGC facts too, kept as they are)."""

    executor: str | None = None    # what trained it: backprop (pipelined_backprop: no role)
