"""The sync executor's delay lines for stage gradients (:class:`StageGradientDelay`)."""

from __future__ import annotations

from collections import deque

import torch


class StageGradientDelay:
    """The sync executor's copy of the async workers' running ahead: stage k's gradient,
    computed at step t, is applied at step t + ``delays[k]`` (:attr:`RGCConfig.
    stage_gradient_delays`); until the first one is due the stage has none (its AdamW skips
    it, as the async worker's does)."""

    def __init__(self, params: list[list[torch.nn.Parameter]], delays: list[int]) -> None:
        self.params, self.delays = params, delays
        self._lines: dict[int, deque[list[torch.Tensor | None]]] = {
            k: deque() for k, d in enumerate(delays) if d > 0}

    def shift(self) -> None:
        """Hold back each delayed stage's ``.grad`` and put the one due now in its place."""
        for k, line in self._lines.items():
            line.append([p.grad for p in self.params[k]])
            due = line.popleft() if len(line) > self.delays[k] else [None] * len(self.params[k])
            for p, g in zip(self.params[k], due):
                p.grad = g

    def state(self) -> dict[int, list[list[torch.Tensor | None]]]:
        return {k: [list(gs) for gs in line] for k, line in self._lines.items()}

    def restore(self, state: dict[int, list[list[torch.Tensor | None]]]) -> None:
        for k in self._lines:
            self._lines[k] = deque(list(gs) for gs in state.get(k, []))
