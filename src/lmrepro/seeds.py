"""How a run's seed (the ``N`` of its ``seed<N>`` folder, :func:`lmrepro.rundirs.run_path`)
becomes its random streams, in one place.

The model's initialisation draws from torch's global generator seeded with the seed itself
(:func:`seed_init`). The training batches draw from a generator of their own, seeded by one of
three derivations, each tied to the shape of the run that uses it:

* :func:`batches_same_seed`: the seed itself (one process, one stream: the baseline suite);
* :func:`batches_offset`: the seed plus :data:`BATCH_OFFSET` (one stream of batches fed to a
  pipeline of stages, whichever process draws it: the stage-wise trainers and their backprop
  control);
* :func:`batches_of_rank`: one stream per rank of a data-parallel run, spaced by
  :data:`RANK_STRIDE`.

The derivations are fixed: a published run is reproduced bit for bit only by the stream it was
trained on, so a new trainer picks one of these rather than a fourth.
"""

from __future__ import annotations

import torch

#: a prime far above any seed in use: the offset stream never starts where the initialisation of
#: a seed in use does (the per-rank streams differ from their own run's initialisation, but
#: seed 0's rank 0 starts where seed 1's initialisation does: streams of two runs, not of one)
BATCH_OFFSET = 1_000_003
#: a prime spacing the batch streams of one data-parallel run's ranks
RANK_STRIDE = 7919


def seed_init(seed: int) -> None:
    """Seed the global generator the model's initialisation draws from."""
    torch.manual_seed(seed)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batches_same_seed(seed: int) -> torch.Generator:
    """The batch stream seeded with the run's seed itself."""
    return _generator(seed)


def batches_offset(seed: int) -> torch.Generator:
    """The batch stream seeded :data:`BATCH_OFFSET` above the run's seed."""
    return _generator(seed + BATCH_OFFSET)


def batches_of_rank(seed: int, rank: int) -> torch.Generator:
    """Rank ``rank``'s batch stream of a data-parallel run."""
    return _generator(seed * BATCH_OFFSET + RANK_STRIDE * rank + 1)
