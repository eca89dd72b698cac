"""Bounded-horizon local training with Readout-Gradient Consensus (RGC).

docs/papers.md ("RGC"); docs/rgc.md describes this implementation. Public API:

* :class:`RGCConfig` (one run) and :class:`RGCSuite` (the ``rgc:`` section), in
  :mod:`~lmrepro.rgc.config`;
* :func:`train` (:mod:`~lmrepro.rgc.runner`): one run with the ``"sync"``, ``"async"`` or
  ``"backprop"`` executor;
* the math (stage cut, horizon, consensus) in :mod:`~lmrepro.rgc.stages`; the executors in
  :mod:`~lmrepro.rgc.sync` and :mod:`~lmrepro.rgc.async_`; the pipeline stage in
  :mod:`~lmrepro.rgc.stage`; the paper's claims in :mod:`~lmrepro.rgc.claims`.

Names are imported lazily, so reading the configuration (``lmrepro.rgc.config``) does not load
the executors.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "EXECUTORS": "config", "RGCConfig": "config", "RGCSuite": "config",
    "ThreadOversubscriptionWarning": "config", "TrainResult": "result", "train": "runner",
    "StageWorkerError": "async_", "accumulate_rgc_grads": "stages",
    "consensus_decoder_grad": "stages", "horizon_window": "stages", "stage_bounds": "stages",
    "stage_local_grads": "stages",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"lmrepro.rgc.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'lmrepro.rgc' has no attribute {name!r}")
