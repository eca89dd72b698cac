"""The SCAPE wing (arXiv 2607.01678): data-parallel training of SCAPE and its baselines under
torchrun. :mod:`~lmrepro.scape.config` (the ``scape:`` section), :mod:`~lmrepro.scape.trainer`
(one worker's loop), :mod:`~lmrepro.scape.worker` (the worker program), :mod:`~lmrepro.scape.launch`
(torchrun from Python), :mod:`~lmrepro.scape.cli` (``lmrepro train-scape``, ``lmrepro scaling``),
:mod:`~lmrepro.scape.stage` (the pipeline stage), :mod:`~lmrepro.scape.claims` (the paper's
claims), :mod:`~lmrepro.scape.wing` (what the wing adds to the pipeline). The optimizers
themselves are the standalone library :mod:`lmrepro.optim`."""
