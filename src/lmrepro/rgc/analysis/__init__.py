"""Reading RGC runs and benchmarks: the tensor bytes of a run by stage and kind
(:mod:`~lmrepro.rgc.analysis.byte_account`), the ideal step time of the async schedule
(:mod:`~lmrepro.rgc.analysis.schedule`), async RGC's speed-up over backprop decomposed
(:mod:`~lmrepro.rgc.analysis.speedup`) and the RGC tables of the analysis report
(:mod:`~lmrepro.rgc.analysis.report`)."""
