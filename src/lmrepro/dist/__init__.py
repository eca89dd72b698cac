"""Distributed (torchrun) training: runtime set-up, the ``train-scape`` worker loop, the launcher
and the notebook's suite runner. See docs/scape.md."""
