"""The RGC wing's roles in the analysis: a run of method ``rgc`` is ``rgc_async`` or ``rgc_sync``
by its executor. Registered by :mod:`lmrepro.rgc.wing`."""

import enum


class RGCMethod(enum.StrEnum):
    """The RGC wing's method, as ``RunSummary.method`` records it (its backprop executor records
    the baseline wing's ``backprop``)."""

    RGC = "rgc"                # bounded-horizon local training with readout-gradient consensus


METHOD_RGC = RGCMethod.RGC.value
ROLE_RGC_ASYNC = "rgc_async"
ROLE_RGC_SYNC = "rgc_sync"
