"""The decoder's consensus gradients waiting to be applied (:class:`ConsensusQueue`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import torch

from lmrepro.optim.comm import flat_to_grads


class ConsensusQueue:
    """Consensus gradients of the decoder (the mean over stages of the readout gradients, as one
    flat tensor per step) waiting to be applied: with staleness s the gradient of step t is
    applied at step t + s (s = 0: the same step, in lockstep), so the first s steps make no
    decoder update. Every replica applies the same gradient in the same step, so the replicas
    stay identical. An entry may still be in flight (an asynchronous all-reduce): ``finish``
    completes it (waits, then divides by K, or by the sum of the local losses' weights) exactly
    once."""

    def __init__(self, params: list[torch.nn.Parameter], staleness: int,
                 pending: Iterable[torch.Tensor] = ()) -> None:
        self.params, self.staleness = params, staleness
        self._queue: deque[tuple[torch.Tensor, Callable[[], object] | None]] = deque(
            (t, None) for t in pending)

    def restore(self, pending: Iterable[torch.Tensor]) -> None:
        """Replace the queue with a checkpoint's pending gradients."""
        self._queue = deque((t, None) for t in pending)

    def push(self, flat: torch.Tensor, finish: Callable[[], object] | None = None) -> None:
        self._queue.append((flat, finish))

    def _complete(self, i: int) -> torch.Tensor:
        flat, finish = self._queue[i]
        if finish is not None:
            finish()
            self._queue[i] = (flat, None)
        return flat

    def pop_into_grads(self) -> bool:
        """Write the gradient due now into the parameters' ``.grad`` and return True; with none
        due yet, clear the gradients and return False (skip the decoder's optimizer step)."""
        if len(self._queue) <= self.staleness:
            for p in self.params:
                p.grad = None
            return False
        flat = self._complete(0)
        self._queue.popleft()
        flat_to_grads(flat, self.params)
        return True

    def state(self) -> list[torch.Tensor]:
        """The gradients still pending, completed (for a checkpoint)."""
        return [self._complete(i).clone() for i in range(len(self._queue))]
