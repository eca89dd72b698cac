"""SCAPE's training-length study: running it (:mod:`~lmrepro.scape.study.scaling`), its analysis
(:mod:`~lmrepro.scape.study.report`) and figures (:mod:`~lmrepro.scape.study.plots`), steps to
target (:mod:`~lmrepro.scape.study.horizon`), the mechanism contrasts
(:mod:`~lmrepro.scape.study.mechanism`) and the regenerated sections of docs/scape.md
(:mod:`~lmrepro.scape.study.review`, :mod:`~lmrepro.scape.study.mechanism_review`)."""
