"""The data layer's errors: a source that cannot be read, or bytes that are not what was pinned.

Both are :class:`DataError`, which the command line reports as one message (exit status 1):
unlike a bad parameter (:class:`lmrepro.errors.ParameterError`), fixing one usually means a
network, a mirror or a re-run rather than an edit of ``params.yaml``.
"""

from __future__ import annotations

__all__ = ["DataError", "IntegrityError", "SourceUnavailableError"]


class DataError(RuntimeError):
    """A data file or source is unusable: unreachable, corrupt, or not what was pinned."""


class SourceUnavailableError(DataError):
    """The source (URL, hub id, local path) cannot be read."""


class IntegrityError(DataError):
    """A downloaded, cached or prepared file does not match its checksum, size or format."""
