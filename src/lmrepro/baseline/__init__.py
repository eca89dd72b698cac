"""The single-process global-backprop baseline: AdamW, warm-up + cosine, global-norm clipping.

:mod:`~lmrepro.baseline.config` (the ``train:`` section), :mod:`~lmrepro.baseline.trainer`
(:func:`train_single`: its setup and summary around the package's one global-backprop trainer,
:func:`lmrepro.backprop.train_backprop`), :mod:`~lmrepro.baseline.stage` (the pipeline stage).
"""
