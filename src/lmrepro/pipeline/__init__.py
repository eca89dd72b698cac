"""The replication pipeline: the parameter file and its profiles (:mod:`~.params`), the analysis
of the training stages (:mod:`~.analysis`, :mod:`~.plots`), the claims registry
(:mod:`~.claims`), the report index (:mod:`~.report`) and the notebook runner (:mod:`~.notebook`).
Each wing runs its own training stage (``lmrepro.<wing>.stage``); this package composes them."""
