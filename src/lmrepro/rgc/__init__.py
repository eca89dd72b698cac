"""Bounded-horizon local training with Readout-Gradient Consensus (RGC).

DESIGN.md, "RGC, reference design"; docs/rgc.md describes this implementation. Public API:

* :class:`RGCConfig`: model shape, stage cut, horizon, optimizer, threads, eval, checkpoints;
* :func:`train`: one run with the ``"sync"``, ``"async"`` or ``"backprop"`` executor;
* :func:`run_suite`: the notebook's runs, skipping finished ones;
* :func:`consensus_decoder_grad`: the consensus (mean of the stages' readout gradients);
* the math in :mod:`lmrepro.rgc.stages`.
"""

from lmrepro.rgc.common import TrainResult
from lmrepro.rgc.config import EXECUTORS, RGCConfig, ThreadOversubscriptionWarning
from lmrepro.rgc.stages import (accumulate_rgc_grads, consensus_decoder_grad, horizon_window,
                                stage_bounds, stage_local_grads)
from lmrepro.rgc.runner import run_suite, train

__all__ = [
    "EXECUTORS", "RGCConfig", "StageWorkerError", "ThreadOversubscriptionWarning",
    "TrainResult", "accumulate_rgc_grads", "consensus_decoder_grad", "horizon_window",
    "run_suite", "stage_bounds", "stage_local_grads", "train",
]


def __getattr__(name: str):  # lazy: importing torch.distributed only when needed
    if name == "StageWorkerError":
        from lmrepro.rgc.async_exec import StageWorkerError
        return StageWorkerError
    raise AttributeError(name)
