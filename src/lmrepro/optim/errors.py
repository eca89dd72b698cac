"""Bad-argument errors of the optimizer library (standalone: it imports nothing else of lmrepro).

A message always names the parameter, the bad value and what is allowed, e.g.
``SCAPE.sparsity = 1.5: must be a number in [0, 1)``. :mod:`lmrepro.errors` re-exports these, so
the rest of the package raises and catches the same type.
"""

from __future__ import annotations

from typing import Any


class ParameterError(ValueError):
    """A parameter, file or input that the caller can fix."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        self.name = name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{name} = {value!r}: {allowed}")


def check(condition: bool, name: str, value: Any, allowed: str) -> None:
    """Raise :class:`ParameterError` unless ``condition`` holds."""
    if not condition:
        raise ParameterError(name, value, allowed)


class NonFiniteGradientError(ParameterError):
    """A gradient handed to ``step()`` holds NaN or infinity. The optimizers raise it on every rank
    of the group at once (the finiteness of each rank's gradient travels with the step's one
    collective), before any state is changed, so a trainer can stop the run and record it as
    diverged."""
