"""The baseline wing's role in the analysis: single-process global backprop (the RGC paper's
foil), registered by :mod:`lmrepro.baseline.wing`."""

ROLE_BACKPROP = "backprop"
