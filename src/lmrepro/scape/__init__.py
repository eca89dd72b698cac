"""The SCAPE wing (arXiv 2607.01678): data-parallel training of SCAPE and its baselines under
torchrun.

At the top, what the rest of the program reads of the wing: :mod:`~lmrepro.scape.wing` (what
the wing adds to the pipeline), :mod:`~lmrepro.scape.config` (the ``scape:`` section),
:mod:`~lmrepro.scape.roles`, :mod:`~lmrepro.scape.details`, :mod:`~lmrepro.scape.columns`,
:mod:`~lmrepro.scape.claims` (the paper's claims), :mod:`~lmrepro.scape.cli` (``lmrepro
train-scape``, ``lmrepro scaling``) and :mod:`~lmrepro.scape.stage` (the pipeline stage). The
rooms below: :mod:`~lmrepro.scape.train` (the trainer, the worker program, torchrun, the sweep),
:mod:`~lmrepro.scape.study` (the training-length study), :mod:`~lmrepro.scape.steptime` (the
step-time model), :mod:`~lmrepro.scape.authors` (the authors' logs) and
:mod:`~lmrepro.scape.analysis` (the suite's own tables). The optimizers themselves are the
standalone library :mod:`lmrepro.optim`."""
