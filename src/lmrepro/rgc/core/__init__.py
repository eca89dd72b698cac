"""What every RGC executor shares: the math of stages, horizon and consensus
(:mod:`~lmrepro.rgc.core.stages`), the model, optimizer, schedule and batches they train with
(:mod:`~lmrepro.rgc.core.recipe`), the corpus (:mod:`~lmrepro.rgc.core.corpus`), the checkpoint
(:mod:`~lmrepro.rgc.core.checkpoint`), what to run (:mod:`~lmrepro.rgc.core.run_spec`), its
memory by phase (:mod:`~lmrepro.rgc.core.run_memory`) and its end
(:mod:`~lmrepro.rgc.core.result`)."""
