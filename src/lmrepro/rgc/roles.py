"""The RGC wing's roles in the analysis: a run of method ``rgc`` is ``rgc_async`` or ``rgc_sync``
by its executor. Registered by :mod:`lmrepro.rgc.wing`."""

METHOD_RGC = "rgc"
ROLE_RGC_ASYNC = "rgc_async"
ROLE_RGC_SYNC = "rgc_sync"
