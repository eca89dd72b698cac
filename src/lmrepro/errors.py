"""One error type for bad input, so every message has the same shape.

A message always names the parameter, the bad value and what is allowed, e.g.
``train.steps = -3: must be an integer >= 1``. :class:`ParameterError` and :func:`check` are
defined by the standalone optimizer library (:mod:`lmrepro.optim.errors`, which may import
nothing else of the package) and used everywhere.
"""

from __future__ import annotations

from typing import Any

from lmrepro.optim.errors import ParameterError, check

__all__ = ["ConfigError", "ParameterError", "check"]


class ConfigError(ParameterError):
    """A bad configuration: the message lists every offending key path with value and rule."""

    def __init__(self, name: str, value: Any, message: str) -> None:
        self.name = name
        self.value = value
        self.allowed = message
        ValueError.__init__(self, message)
