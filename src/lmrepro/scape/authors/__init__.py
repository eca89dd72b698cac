"""The SCAPE authors' own training logs: the tidy table of their Megatron logs
(:mod:`~lmrepro.scape.authors.logs`, ``lmrepro authors-logs``), what they measured
(:mod:`~lmrepro.scape.authors.analysis`), the step-time model fitted to them
(:mod:`~lmrepro.scape.authors.fit`), and the report section of notebook 09 built from them
(:mod:`~lmrepro.scape.authors.report`, :mod:`~lmrepro.scape.authors.page`)."""
