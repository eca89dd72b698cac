"""The SCAPE suite's own tables and figures beside the shared analysis (notebooks 04 and 06):
the mask-rule ablation, coverage and residual norm over steps, the learning-rate sweep
(:mod:`~lmrepro.scape.analysis.report`)."""
