"""The typed schema of ``params.yaml`` and its profiles.

``params.yaml`` holds the default profile (2 CPU cores, ``dvc repro`` in about 15 minutes) at its
top level, a ``profile`` key naming the active profile, and a ``profiles`` mapping of named
overrides (``smoke`` for tests, ``reference`` for the published reference run, ``paper`` for the
papers' scale). The active configuration is the top level deep-merged with ``profiles[profile]``.

``seeds`` lists the training seeds: every training suite runs once per seed, and the analysis
pairs runs by seed (``docs/statistics.md``).

Every stage validates the merged configuration before it does anything: an unknown key, a wrong
type or an out-of-range value stops with the key path, the value and what is allowed, e.g.::

    params.yaml (profile 'default'): train.steps = -3: Input should be greater than 0

Why pydantic: strict, nested, with key paths in its errors; ``extra="forbid"`` turns a typo into
an error instead of a silently ignored setting. Strict means no coercion: ``seed: yes`` (a YAML
boolean), ``tie_embeddings: 'off'`` and ``n_layers: '7'`` (strings) are refused, not read as 1,
False and 7.

The file itself is read strictly too (:func:`lmrepro.paramfile.read_params_file`): a key given
twice in one mapping is refused (PyYAML would silently keep the last one), and a syntax error is
one line naming the file, the line and the column, e.g.::

    params.yaml:52:3: YAML syntax error: could not find expected ':'
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, ValidationError, create_model, model_validator

from lmrepro.cluster.config import LauncherConfig
from lmrepro.config import Section, config_error, field_error
from lmrepro.data.spec import DataConfig
from lmrepro.model import ModelConfig
from lmrepro.paramfile import read_params_file, resolve_profile
from lmrepro.pipeline import registry
from lmrepro.stats import StatsConfig

__all__ = ["Params", "load_params", "params_model", "validate_profile"]


class Params(Section):
    """The whole validated configuration of one profile: ``profile``, ``seeds``, ``data``,
    ``model``, then each wing's section (its own configuration class, its
    :attr:`lmrepro.pipeline.registry.Wing.section`: ``train``, ``scape``, ``rgc``), then
    ``stats`` and ``launcher``. The class that validates is :func:`params_model` (a subclass
    of this one, composed of the installed wings' sections); a wing's section reads as
    ``params.<key>``."""

    key: ClassVar[str] = ""

    if TYPE_CHECKING:
        profile: str
        seeds: list[int]
        data: DataConfig
        model: ModelConfig
        stats: StatsConfig
        launcher: LauncherConfig

        def __getattr__(self, name: str) -> Any: ...

    @model_validator(mode="after")
    def _seeds_distinct(self) -> Params:
        if any(s < 0 for s in self.seeds) or len(set(self.seeds)) != len(self.seeds):
            raise field_error("seeds", self.seeds, "must be distinct integers >= 0")
        return self

    @model_validator(mode="after")
    def _corpora_prepared(self) -> Params:
        for section in registry.sections():
            for key, name in section.corpora(getattr(self, section.key)):
                if name not in self.data.use:
                    raise field_error(key, name, f"is not prepared by this profile "
                                      f"(data.use = {self.data.use})")
        return self


#: the schema built for each list of the installed wings' sections
_MODELS: dict[tuple[registry.Section, ...], type[Params]] = {}


def params_model() -> type[Params]:
    """The schema of a profile: :class:`Params` with its fields in the file's order, the
    installed wings' sections between ``model`` and ``stats`` in the wings' order, then
    ``launcher`` (where the runs execute: :mod:`lmrepro.cluster.config`)."""
    sections = registry.sections()
    if sections not in _MODELS:
        fields: dict[str, Any] = {
            "profile": (str, ...),
            "seeds": (list[int], Field(min_length=1, description="training seeds: every "
                                       "training suite runs once per seed (>= 3 for a "
                                       "seed-level verdict)")),
            "data": (DataConfig, ...),
            "model": (ModelConfig, ...),
        }
        fields |= {s.key: (s.config_class(), ...) for s in sections}
        fields["stats"] = (StatsConfig, StatsConfig())
        fields["launcher"] = (LauncherConfig, LauncherConfig())
        _MODELS[sections] = create_model("Params", __base__=Params, __module__=__name__,
                                         **fields)
    return _MODELS[sections]


def validate_profile(raw: dict[str, Any], profile: str | None, where: str) -> Params:
    """Merge and validate one profile of a raw parameter mapping."""
    merged = resolve_profile(raw, profile)
    try:
        return params_model().model_validate(merged)
    except ValidationError as err:
        raise config_error(err, where=f"{where} (profile {merged['profile']!r})") from None


def load_params(path: str | Path = "params.yaml", profile: str | None = None) -> Params:
    """Read, merge and validate ``params.yaml``; raise :class:`ParameterError` on bad input.

    Every profile in the file is validated, not only the active one, so a mistake in a profile
    you are not running is found now rather than when someone selects it."""
    raw = read_params_file(path)
    active = validate_profile(raw, profile, str(path))
    # the base first: a mistake in it is reported as the base's, not as the first profile's
    # that happens to inherit it
    others = ["default"] + sorted(raw.get("profiles") or {})
    for name in dict.fromkeys(others):
        if name != active.profile:
            validate_profile(raw, name, str(path))
    return active
