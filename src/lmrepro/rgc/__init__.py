"""Bounded-horizon local training with Readout-Gradient Consensus (RGC).

docs/papers.md ("RGC"); docs/rgc.md describes this implementation. Public API:

* :class:`RGCConfig` (one run) and :class:`RGCSuite` (the ``rgc:`` section), in
  :mod:`~lmrepro.rgc.config`;
* :func:`train` (:mod:`~lmrepro.rgc.executors.runner`): one run with the ``"sync"``,
  ``"async"`` or ``"backprop"`` executor;
* the math (stage cut, horizon, consensus) in :mod:`~lmrepro.rgc.core.stages`; the pipeline
  stage in :mod:`~lmrepro.rgc.stage`; the paper's claims in :mod:`~lmrepro.rgc.claims`.

At the top, what the rest of the program reads of the wing (``wing``, ``config``, ``roles``,
``details``, ``columns``, ``claims``) and its entry points (``cli``, ``stage``). The rooms
below: :mod:`~lmrepro.rgc.core` (what every executor shares: the math, the recipe, the corpus,
the checkpoint, the run's spec, memory and result), :mod:`~lmrepro.rgc.executors` (the sync,
async, pipelined and backprop executors, the async workers and their wire, and
:func:`train`, which picks one), :mod:`~lmrepro.rgc.analysis` (the byte account, the
schedule, the speed-up and the report's tables) and :mod:`~lmrepro.rgc.study` (the
training-length study).

Names are imported lazily, so reading the configuration (``lmrepro.rgc.config``) does not load
the executors.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "EXECUTORS": "config", "RGCConfig": "config", "RGCSuite": "config",
    "ThreadOversubscriptionWarning": "config", "TrainResult": "core.result",
    "train": "executors.runner", "StageWorkerError": "executors.async_",
    "accumulate_rgc_grads": "core.stages", "consensus_decoder_grad": "core.stages",
    "horizon_window": "core.stages", "stage_bounds": "core.stages",
    "stage_local_grads": "core.stages",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"lmrepro.rgc.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'lmrepro.rgc' has no attribute {name!r}")
