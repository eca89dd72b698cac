"""The wings' vocabulary, as the pipeline reads it: their methods' roles, the comparisons
(pairings) between roles, each analysis stage's reference roles, their parameter sections, their
claims, table columns and parts of the index.

The pipeline names no method of either paper. Each wing (``lmrepro.baseline``, ``lmrepro.scape``,
``lmrepro.rgc``) declares what it adds as one value, a :class:`Wing` (its ``wing`` module's
``WING``); :mod:`lmrepro.wings` lists them, and the program that runs the pipeline (the
``lmrepro`` command, a notebook's first cell, the tests) hands that list to :func:`install`.
Nothing registers when a module is imported, and nothing here imports a wing: dependencies point
downwards only, from the composition to the wings to the pipeline. The order of the list is the
order of every list read here (the methods in error messages, the parameter sections, the
pairings, the claims table): baseline, SCAPE, RGC.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lmrepro.errors import ParameterError, check
from lmrepro.results import RunDetails, use_details_models, use_renamed_settings


@dataclass(frozen=True)
class Role:
    """What a run is in the analysis: ``name`` (e.g. ``rgc_async``) and the summary's ``method``
    it stands for. Where a method's runs are several roles, a fact of their details tells them
    apart, ``by`` (every role of the method names the same), and a role stands for the runs
    whose fact is one of its ``values`` (None: a run that did not record it); a role without
    ``by`` stands for every run of its method. ``data_parallel``: its processes are
    data-parallel replicas (their count is the world size). ``label_details``: what its label
    shows of a run's details after the method, as ``(format, fact)`` pairs, e.g.
    ``(" H={}", "horizon")`` gives ``rgc H=2``; a fact the run did not record is left out."""

    name: str
    method: str
    by: str | None = None
    values: tuple[Any, ...] = (None,)
    data_parallel: bool = False
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
    records: training ``metrics``, ``analyses`` (``analysis.json``) and ``extra`` files; the
    ``published`` patterns of its own products that ``lmrepro publish`` copies besides the
    shared ones (:data:`lmrepro.pipeline.publish.PATTERNS`), and ``headline``, the
    ``module:function`` that recomputes its own headline metrics from a finished run's
    ``results/`` folder (``function(results) -> {stage: items}``, for a publication whose run
    predates them: :func:`lmrepro.pipeline.pages.from_run`)."""

    scale: Callable[[Mapping[str, Any], Mapping[str, int]], str | None] | None = None
    rank: int = 0
    metrics: tuple[str, ...] = ()
    analyses: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    published: tuple[str, ...] = ()
    headline: str | None = None
    wing: str = ""


@dataclass(frozen=True)
class Wing:
    """What one wing adds to the pipeline, declared once in its ``wing`` module as ``WING``:

    * ``roles``: what its runs are in the analysis (:class:`Role`: a method, or a method's runs
      split by a fact of their details; a run that is no role is refused);
    * ``pairings``: ``(candidate role, baseline role)`` pairs, which roles a comparison judges
      against which (docs/statistics.md); ``timed``: those of them whose throughput each
      publish records in the timing history, to be pooled over sessions
      (:mod:`lmrepro.pipeline.timing_history`);
    * ``analyses``: each analysis stage (``results/<stage>/runs``) with the reference roles of
      its tables: throughput and memory, and communication (None: no communication table);
    * ``records``: stages whose ``results/analysis/<stage>/analysis.json`` the claims read
      although they are no analysis stage (e.g. a training-length study's verdict point);
    * ``section``: its section of the parameter file;
    * ``details``: method -> the :class:`~lmrepro.results.RunDetails` class its runs' details
      are read as;
    * ``setting``: the fact of its runs' details that, beside the role, tells its
      configurations apart (a number): replicates share it, the analysis records keep the
      candidate's as ``setting`` and a claim may pick comparisons by it (None: it has none);
    * ``byte_kinds``: the kinds of bytes its runs hand to collectives (``bytes_<kind>`` in the
      metrics, ``RunSummary.bytes_per_step`` beside the total), each with its name in words,
      in the order the tables and plots show them;
    * ``run_facts``: the facts of its runs' details that the analysis records keep for its
      claims (``RunRecord.facts``);
    * ``claims``: the module holding its ``CLAIMS``
      (:class:`lmrepro.pipeline.claims.Claim`, in table order), and ``tables``: the module
      holding its table vocabulary, ``COLUMNS`` (name -> :class:`lmrepro.pipeline.tables.Column`)
      and ``PRESETS`` (name -> column names). Both are named by module and imported when first
      read, so that what needs only the roles (a training stage) loads neither;
    * ``report``: its part of the index (:class:`Report`);
    * ``commands``: the modules whose ``register(subparsers)`` add its subcommands to the
      ``lmrepro`` command;
    * ``doc_sections``: the modules whose ``doc_sections(root)`` give the marked sections of
      its docs computed from published runs, ``(doc, begin, end, section)``; ``lmrepro publish
      --pages-only`` writes them (:func:`lmrepro.pipeline.pages.regenerate`);
    * ``renamed_settings``: settings of its runs recorded under another name, old -> current
      (a record keeps the names of its day; :func:`lmrepro.results.run_settings` reads both).
    """

    name: str
    roles: tuple[Role, ...] = ()
    pairings: tuple[tuple[str, str], ...] = ()
    timed: tuple[tuple[str, str], ...] = ()
    analyses: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    records: tuple[str, ...] = ()
    section: Section | None = None
    details: Mapping[str, type[RunDetails]] = field(default_factory=dict)
    setting: str | None = None
    byte_kinds: Mapping[str, str] = field(default_factory=dict)
    run_facts: tuple[str, ...] = ()
    claims: str | None = None
    tables: str | None = None
    report: Report | None = None
    commands: tuple[str, ...] = ()
    doc_sections: tuple[str, ...] = ()
    renamed_settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Vocabulary:
    """What :func:`install` reads from the wings, in their order."""

    wings: tuple[Wing, ...]
    methods: Mapping[str, tuple[str | None, Mapping[Any, str]]]   # method -> (by, {value: role})
    roles: Mapping[str, Role]
    pairings: tuple[tuple[str, str], ...]
    timed: tuple[tuple[str, str], ...]
    stages: Mapping[str, tuple[str, str | None]]
    records: tuple[str, ...]                              # stages that only feed the claims
    sections: tuple[Section, ...]
    byte_kinds: Mapping[str, str]


_installed: _Vocabulary | None = None


def _roles_of(wings: Sequence[Wing]
              ) -> tuple[dict[str, Role], dict[str, tuple[str | None, dict[Any, str]]]]:
    roles: dict[str, Role] = {}
    methods: dict[str, tuple[str | None, dict[Any, str]]] = {}
    for wing in wings:
        for role in wing.roles:
            check(role.name not in roles, "role", role.name, "must be registered once")
            roles[role.name] = replace(role, wing=wing.name)
            by, of_value = methods.setdefault(role.method, (role.by, {}))
            check(role.by == by, f"role {role.name!r}: by", role.by,
                  f"must be what the other roles of method {role.method!r} are told by ({by!r})")
            for value in role.values:
                check(value not in of_value, f"role {role.name!r}: values", value,
                      f"must name runs of no other role (it is {of_value.get(value)!r}'s)")
                of_value[value] = role.name
    return roles, methods


def _byte_kinds_of(wings: Sequence[Wing]) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for wing in wings:
        for kind, words in wing.byte_kinds.items():
            check(kinds.get(kind, words) == words, f"{wing.name} byte kind", kind,
                  f"must have the name another wing gives it ({kinds.get(kind)!r})")
            kinds[kind] = words
    return kinds


def _vocabulary(wings: Sequence[Wing]) -> _Vocabulary:
    roles, methods = _roles_of(wings)
    pairings: list[tuple[str, str]] = []
    stages: dict[str, tuple[str, str | None]] = {}
    records: list[str] = []
    sections: dict[str, Section] = {}
    for wing in wings:
        for cand, base in wing.pairings:
            check(cand in roles and base in roles, f"{wing.name} pairing", (cand, base),
                  f"must name registered roles: {sorted(roles)}")
            pairings.append((cand, base))
        for pair in wing.timed:
            check(pair in wing.pairings, f"{wing.name} timed pairing", pair,
                  f"must be one of its pairings: {list(wing.pairings)}")
        for stage, references in wing.analyses.items():
            check(stage not in stages, "stage", stage, "must be registered once")
            stages[stage] = references
        for stage in wing.records:
            check(stage not in records and stage not in stages, "stage", stage,
                  "must be registered once")
            records.append(stage)
        if wing.section is not None:
            key = wing.section.key
            check(key not in sections, "section", key, "must be registered once")
            sections[key] = replace(wing.section, wing=wing.name)
    timed = tuple(pair for wing in wings for pair in wing.timed)
    return _Vocabulary(tuple(wings), methods, roles, tuple(pairings), timed, stages,
                       tuple(records), tuple(sections.values()), _byte_kinds_of(wings))


def install(wings: Sequence[Wing]) -> None:
    """Make ``wings`` (:data:`lmrepro.wings.WINGS`) the vocabulary every function below reads,
    and their details classes the ones run summaries are read as. Checked as a whole (a role,
    stage or section declared twice, a pairing naming no role is refused, and the vocabulary
    installed before stays); installing the same list again changes nothing."""
    global _installed
    vocabulary = _vocabulary(wings)
    details: dict[str, type[RunDetails]] = {}
    for wing in wings:
        for method, model in wing.details.items():
            check(details.get(method, model) is model, "details model", method,
                  f"is registered twice ({details.get(method)} and {model})")
            details[method] = model
    use_details_models(details)
    use_renamed_settings({old: new for wing in wings
                          for old, new in wing.renamed_settings.items()})
    _installed = vocabulary


def _vocab() -> _Vocabulary:
    if _installed is None:
        raise RuntimeError("no wings are installed: the program that runs the pipeline hands "
                           "them to lmrepro.pipeline.registry.install (the lmrepro command, a "
                           "notebook's start and the tests install lmrepro.wings.WINGS)")
    return _installed


def wings() -> tuple[Wing, ...]:
    """The installed wings, in their order."""
    return _vocab().wings


def parameter_count(n_params: Mapping[str, int], stage: str) -> str:
    """``", 0.85M parameters"``: the largest parameter count of a stage's runs, where known (a
    part of a :class:`Report` ``scale``: :func:`lmrepro.pipeline.report.scale_sentence`)."""
    n = n_params.get(stage)
    return f", {n / 1e6:.2f}M parameters" if n else ""


# --------------------------------------------------------------------------------------------
# What the pipeline reads
# --------------------------------------------------------------------------------------------

def methods() -> tuple[str, ...]:
    return tuple(_vocab().methods)


def roles() -> Mapping[str, Role]:
    return dict(_vocab().roles)


def role(name: str) -> Role:
    """The registered role ``name``."""
    known = _vocab().roles
    check(name in known, "role", name, f"must be one of {sorted(known)}")
    return known[name]


def is_role(name: str) -> bool:
    return name in _vocab().roles


def role_of(method: str, details: RunDetails | None = None, where: str = "") -> str:
    """The role of a run of ``method`` with ``details`` (see :class:`Role`)."""
    known = _vocab().methods
    if not isinstance(method, str) or method not in known:
        raise ParameterError(f"{where}method", method, f"must be one of {list(known)} "
                             "(the methods the wings register)")
    by, of_value = known[method]
    value = None if by is None or details is None else details.fact(by)
    check(value in of_value, f"{where}details.{by}", value,
          f"must be one of {list(of_value)} for method {method!r}")
    return of_value[value]


def is_data_parallel(name: str) -> bool:
    """Whether the processes of role ``name`` are data-parallel replicas (False when unknown)."""
    found = roles().get(name)
    return found is not None and found.data_parallel


def data_parallel_roles() -> tuple[str, ...]:
    return tuple(r.name for r in roles().values() if r.data_parallel)


def _wing_of(role_name: str) -> Wing | None:
    found = _vocab().roles.get(role_name)
    return next((w for w in _vocab().wings if found and w.name == found.wing), None)


def setting(name: str) -> str | None:
    """The fact that is the setting of role ``name``'s runs (:attr:`Wing.setting`; None when
    its wing has none or the role is unknown)."""
    wing = _wing_of(name)
    return None if wing is None else wing.setting


def run_facts(name: str) -> tuple[str, ...]:
    """The facts of role ``name``'s runs the analysis records keep (:attr:`Wing.run_facts`)."""
    wing = _wing_of(name)
    return () if wing is None else wing.run_facts


def settings() -> tuple[str, ...]:
    """The facts the wings name as their settings, in the wings' order."""
    return tuple(w.setting for w in _vocab().wings if w.setting is not None)


def identity_facts() -> tuple[str, ...]:
    """Every fact of the details that decides what a run is: those the roles are told by and
    the wings' settings, sorted."""
    vocabulary = _vocab()
    by = {b for b, _ in vocabulary.methods.values() if b is not None}
    return tuple(sorted(by | set(settings())))


def byte_kinds() -> Mapping[str, str]:
    """The kinds of bytes the wings' runs send, each with its name in words
    (:attr:`Wing.byte_kinds`), in the wings' order."""
    return dict(_vocab().byte_kinds)


def pairings() -> tuple[tuple[str, str], ...]:
    """Which candidate roles are judged against which baseline roles (docs/statistics.md: "The
    same test judges SCAPE vs dense AdamW/AdamS and RGC vs global backprop"), as
    ``(candidate role, baseline role)`` pairs."""
    return _vocab().pairings


def timed_pairings() -> tuple[tuple[str, str], ...]:
    """The pairings whose throughput the timing history records and pools (:attr:`Wing.timed`)."""
    return _vocab().timed


def stages() -> Mapping[str, tuple[str, str | None]]:
    """Each analysis stage's reference roles: throughput and memory, communication."""
    return dict(_vocab().stages)


def doc_sections() -> tuple[str, ...]:
    """The modules that generate the installed wings' doc sections (``Wing.doc_sections``)."""
    return tuple(m for wing in _vocab().wings for m in wing.doc_sections)


def record_stages() -> tuple[str, ...]:
    """Every stage whose ``analysis.json`` the claims read: the analysis stages, then the
    others (:attr:`Wing.records`)."""
    vocabulary = _vocab()
    return (*vocabulary.stages, *vocabulary.records)


def study_stages() -> tuple[str, ...]:
    """The stages that are no analysis stage but whose analysis the claims read
    (:attr:`Wing.records`: the training-length studies)."""
    return _vocab().records


def sections() -> tuple[Section, ...]:
    return _vocab().sections


def reports() -> tuple[Report, ...]:
    """The wings' :class:`Report` s, in the wings' order."""
    return tuple(replace(w.report, wing=w.name) for w in _vocab().wings if w.report is not None)


def columns() -> Mapping[str, Any]:
    """The columns the wings declare (:attr:`Wing.tables`)."""
    return {k: v for m in _table_modules() for k, v in importlib.import_module(m).COLUMNS.items()}


def presets() -> Mapping[str, list[str]]:
    """The table presets the wings declare (:attr:`Wing.tables`)."""
    return {k: v for m in _table_modules() for k, v in importlib.import_module(m).PRESETS.items()}


def _table_modules() -> tuple[str, ...]:
    return tuple(w.tables for w in _vocab().wings if w.tables)


def claims() -> tuple[Any, ...]:
    """Every claim the wings declare, in the wings' order."""
    return tuple(c for w in _vocab().wings if w.claims
                 for c in importlib.import_module(w.claims).CLAIMS)
