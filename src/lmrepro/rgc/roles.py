"""The RGC wing's roles in the analysis: a run of method ``rgc`` is ``rgc_async`` or ``rgc_sync``
by its executor. Declared to the pipeline by :mod:`lmrepro.rgc.wing`."""

import enum


class RGCMethod(enum.StrEnum):
    """The RGC suite's methods, as ``RunSummary.method`` records them."""

    RGC = "rgc"                # bounded-horizon local training with readout-gradient consensus
    BACKPROP = "backprop"      # its backprop executor: the baseline wing's method (global backprop)


METHOD_RGC = RGCMethod.RGC.value
ROLE_RGC_ASYNC = "rgc_async"
ROLE_RGC_SYNC = "rgc_sync"
#: the role the RGC runs are judged against: global backprop, declared by the baseline wing
#: (``lmrepro.baseline.roles``; a wing does not import another, so the name is repeated here)
ROLE_BACKPROP = RGCMethod.BACKPROP.value
