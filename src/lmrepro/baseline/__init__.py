"""The single-process global-backprop baseline: AdamW, warm-up + cosine, global-norm clipping.

:mod:`~lmrepro.baseline.config` (the ``train:`` section), :mod:`~lmrepro.baseline.trainer`
(:func:`train_single`), :mod:`~lmrepro.baseline.stage` (the pipeline stage).
"""
