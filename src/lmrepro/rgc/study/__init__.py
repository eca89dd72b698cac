"""RGC's training-length study: running it (:mod:`~lmrepro.rgc.study.scaling`) and its analysis
(:mod:`~lmrepro.rgc.study.report`)."""
