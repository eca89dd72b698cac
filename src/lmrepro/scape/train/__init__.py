"""Training the SCAPE suite: one worker's loop (:mod:`~lmrepro.scape.train.trainer`), the worker
program torchrun starts (:mod:`~lmrepro.scape.train.worker`), torchrun from Python
(:mod:`~lmrepro.scape.train.launch`), the learning-rate sweep (:mod:`~lmrepro.scape.train.sweep`)
and the GPU check of the same code (:mod:`~lmrepro.scape.train.gpu_check`)."""
