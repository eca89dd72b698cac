"""What the wings register with the shared pipeline: their methods' roles, the comparisons
(pairings) between roles, each analysis stage's reference roles, their parameter sections and
their claims.

The pipeline names no method of either paper: a wing (``lmrepro.baseline``, ``lmrepro.scape``,
``lmrepro.rgc``) declares its vocabulary in its ``wing`` module by calling the ``register_*``
functions below at import time, the way ``lmrepro.cli`` lets each wing register its
subcommands. One module above the pipeline and the wings, :mod:`lmrepro.wings`, imports every
wing's ``wing`` module, in the order that fixes the order of every registered list (baseline,
SCAPE, RGC). Dependencies point downwards only: a wing imports the pipeline, never the reverse.

The pipeline's functions that need the vocabulary call :func:`load_wings` first, which imports
:mod:`lmrepro.wings` by name (the pipeline's one dynamic import: the composition it may not import
statically without an import cycle); ``lmrepro.cli`` and tests may import :mod:`lmrepro.wings`
themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmrepro.errors import ParameterError, check

#: the composition module that imports every wing's registrations
WINGS_MODULE = "lmrepro.wings"


@dataclass(frozen=True)
class Role:
    """What a run is in the analysis: ``name`` (e.g. ``rgc_async``), the summary's ``method`` and
    ``executors`` it stands for (None: a summary without one), whether its processes are
    data-parallel replicas (their count is the world size), whether it is a sparse-communication
    method (its label shows the sparsity), whether its label shows the executor, and which of
    the run's details it shows (``label_details``: ``(short name, details attribute)`` pairs,
    e.g. ``("H", "horizon")`` gives ``H=2``; a detail the run did not record is left out)."""

    name: str
    method: str
    executors: tuple[str | None, ...] = (None,)
    data_parallel: bool = False
    sparse: bool = False
    label_executor: bool = False
    label_details: tuple[tuple[str, str], ...] = ()
    wing: str = ""


@dataclass(frozen=True)
class Section:
    """A wing's section of the parameter file: the ``key``, where its configuration class is
    (``"module:Class"``, imported when the schema is built) and the corpora it trains on
    (``(key path, corpus name)`` pairs of a validated section, checked against ``data.use``)."""

    key: str
    config: str
    corpora: Callable[[Any], Sequence[tuple[str, str]]]
    wing: str = ""

    def config_class(self) -> type:
        """The configuration class; its ``key`` must be this section's."""
        module, _, name = self.config.partition(":")
        cls = getattr(importlib.import_module(module), name)
        check(getattr(cls, "key", None) == self.key, f"section {self.key!r}", self.config,
              f"must be a configuration class whose key is {self.key!r}")
        return cls


@dataclass(frozen=True)
class Report:
    """What a wing adds to the index (``reports/index.html``): its part of the scale sentence
    (``scale(resolved parameters, n_params by stage) -> str | None``; ``rank`` orders the parts:
    the papers' suites at 0, the baseline after them) and the result files whose sha256 the index
    records: training ``metrics``, ``analyses`` (``analysis.json``) and ``extra`` files."""

    wing: str
    scale: Callable[[Mapping[str, Any], Mapping[str, int]], str | None] | None = None
    rank: int = 0
    metrics: tuple[str, ...] = ()
    analyses: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()


_METHODS: dict[str, dict[str | None, str]] = {}      # method -> {executor: role}
_ROLES: dict[str, Role] = {}
_PAIRINGS: list[tuple[str, str]] = []
_STAGES: dict[str, tuple[str, str | None]] = {}
_RECORDS: list[str] = []                             # stages that only feed the claims
_SECTIONS: dict[str, Section] = {}
_REPORTS: list[Report] = []
_TABLES: list[str] = []                              # modules holding COLUMNS and PRESETS
_CLAIMS: list[str] = []                              # modules holding CLAIMS
_loaded = False


def load_wings() -> None:
    """Import :data:`WINGS_MODULE` (once), so that every wing's registrations have run."""
    global _loaded
    if not _loaded:
        _loaded = True
        importlib.import_module(WINGS_MODULE)


def register_roles(wing: str, *roles: Role) -> None:
    """Register ``roles``: each maps a summary's method with each of its executors to the role
    (RGC splits by executor: a run without one is refused)."""
    for role in roles:
        check(role.name not in _ROLES, "role", role.name, "must be registered once")
        _ROLES[role.name] = Role(**{**role.__dict__, "wing": wing})
        for executor in role.executors:
            _METHODS.setdefault(role.method, {})[executor] = role.name


def register_pairings(wing: str, pairings: Sequence[tuple[str, str]]) -> None:
    """Register ``(candidate role, baseline role)`` pairs: which roles a comparison judges
    against which (docs/statistics.md)."""
    for cand, base in pairings:
        check(cand in _ROLES and base in _ROLES, f"{wing} pairing", (cand, base),
              f"must name registered roles: {sorted(_ROLES)}")
        _PAIRINGS.append((cand, base))


def register_stage(stage: str, throughput: str, communication: str | None = None) -> None:
    """Register an analysis stage (``results/<stage>/runs``) with the reference roles of its
    tables: throughput and memory, and communication (None: no communication table)."""
    check(stage not in _STAGES, "stage", stage, "must be registered once")
    _STAGES[stage] = (throughput, communication)


def register_records(stage: str) -> None:
    """Register a stage whose ``results/analysis/<stage>/analysis.json`` the claims read although
    it is no :func:`register_stage` analysis (e.g. the training-length study's verdict point)."""
    check(stage not in _RECORDS and stage not in _STAGES, "stage", stage,
          "must be registered once")
    _RECORDS.append(stage)


def register_section(wing: str, key: str, config: str,
                     corpora: Callable[[Any], Sequence[tuple[str, str]]]) -> None:
    """Register a wing's section ``key`` of the parameter file, validated by the class
    ``config`` (``"module:Class"``: imported when the schema is built, so what needs only the
    roles does not load the wings' configurations), with the corpora it trains on."""
    check(key not in _SECTIONS, "section", key, "must be registered once")
    _SECTIONS[key] = Section(key, config, corpora, wing)


def register_tables(wing: str, module: str) -> None:
    """Register a wing's table vocabulary: ``module`` holds ``COLUMNS`` (name ->
    :class:`lmrepro.pipeline.tables.Column`) and ``PRESETS`` (name -> column names), imported when
    a table first needs them."""
    _TABLES.append(module)


def register_claims(wing: str, module: str) -> None:
    """Register a wing's claims: ``module`` (e.g. ``"lmrepro.scape.claims"``) holds them as
    ``CLAIMS`` (:class:`lmrepro.pipeline.claims.Claim`, in table order). The module is imported
    when the claims are first asked for, so what needs only the roles (a training stage) does not
    load the claims and their measures."""
    _CLAIMS.append(module)


def parameter_count(n_params: Mapping[str, int], stage: str) -> str:
    """``", 0.85M parameters"``: the largest parameter count of a stage's runs, where known (a
    part of a :class:`Report` ``scale``: :func:`lmrepro.pipeline.report.scale_sentence`)."""
    n = n_params.get(stage)
    return f", {n / 1e6:.2f}M parameters" if n else ""


def register_report(report: Report) -> None:
    """Register what a wing adds to the index (:class:`Report`)."""
    _REPORTS.append(report)


# --------------------------------------------------------------------------------------------
# What the pipeline reads
# --------------------------------------------------------------------------------------------

def methods() -> tuple[str, ...]:
    load_wings()
    return tuple(_METHODS)


def roles() -> Mapping[str, Role]:
    load_wings()
    return dict(_ROLES)


def role(name: str) -> Role:
    """The registered role ``name``."""
    load_wings()
    check(name in _ROLES, "role", name, f"must be one of {sorted(_ROLES)}")
    return _ROLES[name]


def is_role(name: str) -> bool:
    load_wings()
    return name in _ROLES


def role_of(method: str, executor: str | None = None, where: str = "") -> str:
    """The role of a run of ``method`` with ``executor`` (see :func:`register_roles`)."""
    load_wings()
    if not isinstance(method, str) or method not in _METHODS:
        raise ParameterError(f"{where}method", method, f"must be one of {list(_METHODS)} "
                             "(the methods the wings register)")
    by_executor = _METHODS[method]
    allowed = list(by_executor)
    check(executor in by_executor, f"{where}executor", executor,
          f"must be one of {allowed} for method {method!r}")
    return by_executor[executor]


def is_data_parallel(name: str) -> bool:
    """Whether the processes of role ``name`` are data-parallel replicas (False when unknown)."""
    found = roles().get(name)
    return found is not None and found.data_parallel


def data_parallel_roles() -> tuple[str, ...]:
    return tuple(r.name for r in roles().values() if r.data_parallel)


def sparse_roles() -> tuple[str, ...]:
    return tuple(r.name for r in roles().values() if r.sparse)


def pairings() -> tuple[tuple[str, str], ...]:
    load_wings()
    return tuple(_PAIRINGS)


def stages() -> Mapping[str, tuple[str, str | None]]:
    load_wings()
    return dict(_STAGES)


def record_stages() -> tuple[str, ...]:
    """Every stage whose ``analysis.json`` the claims read: the analysis stages, then the
    others (:func:`register_records`)."""
    load_wings()
    return (*_STAGES, *_RECORDS)


def sections() -> tuple[Section, ...]:
    load_wings()
    return tuple(_SECTIONS.values())


def reports() -> tuple[Report, ...]:
    """The wings' :class:`Report` s, in registration order."""
    load_wings()
    return tuple(_REPORTS)


def columns() -> Mapping[str, Any]:
    """The columns the wings register (:func:`register_tables`)."""
    load_wings()
    return {k: v for m in _TABLES for k, v in importlib.import_module(m).COLUMNS.items()}


def presets() -> Mapping[str, list[str]]:
    """The table presets the wings register (:func:`register_tables`)."""
    load_wings()
    return {k: v for m in _TABLES for k, v in importlib.import_module(m).PRESETS.items()}


def claims() -> tuple[Any, ...]:
    """Every registered claim, in the order the wings registered their modules."""
    load_wings()
    return tuple(c for module in _CLAIMS for c in importlib.import_module(module).CLAIMS)


def role_constant(name: str, module: str) -> Any:
    """A module ``__getattr__`` for the names the pipeline's modules exported before the wings
    owned their roles: ``ROLE_<ROLE>`` (e.g. ``ROLE_SCAPE``), ``SPARSE`` and ``DATA_PARALLEL``."""
    if name == "SPARSE":
        return sparse_roles()
    if name == "DATA_PARALLEL":
        return data_parallel_roles()
    if name.startswith("ROLE_") and is_role(name.removeprefix("ROLE_").lower()):
        return name.removeprefix("ROLE_").lower()
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
