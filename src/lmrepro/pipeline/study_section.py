"""The parameter section of a training-length study as the engine reads it
(:class:`StudySection`), the checks every such section makes of its points and its sweep, and
the names of the sweep's files, which the engine (:mod:`lmrepro.pipeline.study_engine`) writes
and the analysis (:mod:`lmrepro.pipeline.length_study`) reads.

Each wing declares its own section (its runs, its baseline, its extras) and calls these checks
from its validator where its rules stand in its own order; the messages are the sections'
(:func:`lmrepro.config.field_error`: ``field = value: rule``). The wings import this module
inside their validators: a process that reads only a run's settings (a SCAPE torchrun worker)
loads no part of the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lmrepro.config import field_error

#: the sweep's folder below the study's, its winners' file and the edge check's
SWEEP = "sweep"
SWEEP_JSON = "sweep.json"
EDGE_JSON = "edge_check.json"


class StudySection(Protocol):
    """The fields of a study's parameter section that the engine and the checks read."""

    @property
    def sizes(self) -> Mapping[str, Any]: ...
    @property
    def lengths(self) -> Mapping[str, Sequence[int]]: ...
    @property
    def seeds(self) -> Mapping[str, Sequence[int]]: ...
    @property
    def verdict_size(self) -> str: ...
    @property
    def verdict_steps(self) -> int: ...
    @property
    def verdict_seeds(self) -> Sequence[int]: ...
    @property
    def sweep_factors(self) -> Sequence[float]: ...
    @property
    def sweep_seed(self) -> int: ...
    @property
    def edge_check(self) -> bool: ...


def check_points(section: StudySection, per_size: Sequence[str]) -> None:
    """The section's fields ``per_size`` (mappings by size: ``lengths``, ``seeds``, ...) name
    exactly its sizes, each size's lengths are distinct step counts >= 1, increasing, and the
    verdict size is one of the sizes."""
    for where in per_size:
        keys = set(getattr(section, where))
        if keys != set(section.sizes):
            raise field_error(where, sorted(keys), f"must name exactly the sizes "
                              f"{sorted(section.sizes)}")
    for size, lengths in section.lengths.items():
        if not lengths or sorted(set(lengths)) != lengths or lengths[0] < 1:
            raise field_error(f"lengths.{size}", lengths, "must be distinct step counts "
                              ">= 1, increasing")
    if section.verdict_size not in section.sizes:
        raise field_error("verdict_size", section.verdict_size,
                          f"must be one of {sorted(section.sizes)}")


def check_sweep_factors(section: StudySection) -> None:
    """The lr sweep's factors are distinct positive multiples, increasing, and at least 3 of
    them where there is a sweep (none: no sweep)."""
    factors = section.sweep_factors
    if any(f <= 0 for f in factors) or sorted(set(factors)) != factors:
        raise field_error("sweep_factors", factors,
                          "must be distinct positive factors, increasing")
    if factors and len(factors) < 3:
        raise field_error("sweep_factors", factors, "must hold >= 3 values")


def study_seeds(section: StudySection) -> set[int]:
    """Every seed the study trains its points at: each size's and the verdict point's."""
    return {x for seeds in section.seeds.values() for x in seeds} | set(section.verdict_seeds)
