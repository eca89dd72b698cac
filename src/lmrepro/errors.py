"""One error type for bad input, so every message has the same shape.

A message always names the parameter, the bad value and what is allowed, e.g.
``train.steps = -3: must be an integer >= 1``.
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


class ConfigError(ParameterError):
    """A bad ``params.yaml``: the message lists every offending key path with value and rule."""

    def __init__(self, name: str, value: Any, message: str) -> None:
        self.name = name
        self.value = value
        self.allowed = message
        ValueError.__init__(self, message)
