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

The file itself is read strictly too (:func:`read_params_file`): a key given twice in one mapping
is refused (PyYAML would silently keep the last one), and a syntax error is one line naming the
file, the line and the column, e.g.::

    params.yaml:52:3: YAML syntax error: could not find expected ':'
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import Field, ValidationError, model_validator
from yaml.constructor import ConstructorError

from lmrepro.baseline.config import BaselineSuite
from lmrepro.config import Section, config_error, field_error
from lmrepro.data.spec import DataConfig
from lmrepro.errors import ParameterError
from lmrepro.model import ModelConfig
from lmrepro.rgc.config import RGCSuite
from lmrepro.scape.config import ScapeSuite
from lmrepro.stats import StatsConfig


class Params(Section):
    """The whole validated configuration of one profile: each section is its component's own
    configuration class."""

    key: ClassVar[str] = ""

    profile: str
    seeds: list[int] = Field(min_length=1, description="training seeds: every training suite "
                             "runs once per seed (>= 3 for a seed-level verdict)")
    data: DataConfig
    model: ModelConfig
    train: BaselineSuite
    scape: ScapeSuite
    rgc: RGCSuite
    stats: StatsConfig = StatsConfig()

    @model_validator(mode="after")
    def _seeds_distinct(self) -> Params:
        if any(s < 0 for s in self.seeds) or len(set(self.seeds)) != len(self.seeds):
            raise field_error("seeds", self.seeds, "must be distinct integers >= 0")
        return self

    @model_validator(mode="after")
    def _corpora_prepared(self) -> Params:
        used = [(f"train.corpora[{i}]", c) for i, c in enumerate(self.train.corpora)]
        used += [(f"rgc.corpora[{i}]", c) for i, c in enumerate(self.rgc.corpora)]
        used.append(("scape.corpus", self.scape.corpus))
        for key, name in used:
            if name not in self.data.use:
                raise field_error(key, name, f"is not prepared by this profile "
                                  f"(data.use = {self.data.use})")
        return self


def deep_merge(base: dict, override: dict) -> dict:
    """``base`` with ``override`` merged in; nested dicts merge, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


#: environment variable that selects a profile without editing ``params.yaml`` (a published run
#: is then made from a clean commit): ``LMREPRO_PROFILE=scaling dvc repro``
PROFILE_ENV = "LMREPRO_PROFILE"


def resolve_profile(raw: dict, profile: str | None = None) -> dict:
    """The top level of ``raw`` merged with the named profile's overrides: ``profile``, else
    :data:`PROFILE_ENV` when set, else the file's ``profile:``."""
    raw = dict(raw)
    profiles = raw.pop("profiles", {}) or {}
    name = profile or os.environ.get(PROFILE_ENV) or raw.get("profile", "default")
    if name != "default":
        if name not in profiles:
            raise ParameterError("profile", name,
                                 f"must be 'default' or one of {sorted(profiles)}")
        raw = deep_merge(raw, profiles[name])
    raw["profile"] = name
    return raw


class ParamsFileError(ParameterError):
    """The parameter file is not valid YAML: ``file:line:column: what is wrong``, one line."""

    def __init__(self, path: str | Path, line: int | None, column: int | None, problem: str
                 ) -> None:
        self.name, self.value, self.allowed = "params_file", str(path), problem
        where = str(path) + (f":{line}:{column}" if line is not None else "")
        ValueError.__init__(self, f"{where}: {problem}")


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only: no tags that construct objects) that refuses a key
    repeated in one mapping instead of keeping the last value. Merge keys (``<<: *base``) keep
    their meaning: an explicit key may override a merged one."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:           # an unhashable key: the base class words it
                    continue
                if first is not None:
                    raise ConstructorError(
                        None, None, f"duplicate key {key!r} (first given at line "
                        f"{first.line + 1}); YAML would silently keep only the last value: "
                        "remove one", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]


def load_yaml(text: str, path: str | Path) -> Any:
    """Parse YAML ``text`` with :class:`StrictLoader`; errors are :class:`ParamsFileError`."""
    loader = StrictLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = " ".join(str(p) for p in (err.problem, f"({err.context})" if err.context
                                            else None) if p)
        kind = "" if isinstance(err, ConstructorError) else "YAML syntax error: "
        raise ParamsFileError(path, mark.line + 1 if mark else None,
                              mark.column + 1 if mark else None, kind + problem) from None
    except yaml.YAMLError as err:
        raise ParamsFileError(path, None, None, f"not valid YAML ({err})") from None
    finally:
        loader.dispose()


def read_params_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a parameter file (clear errors for a missing or non-mapping file, a
    syntax error and a duplicate key)."""
    path = Path(path)
    if not path.exists():
        raise ParameterError("params_file", str(path), "must be an existing YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ParamsFileError(path, None, None, f"is not UTF-8 text ({err.reason} at byte "
                              f"{err.start})") from None
    raw = load_yaml(text, path)
    if not isinstance(raw, dict):
        raise ParameterError("params_file", str(path), "must hold a YAML mapping at top level")
    return raw


def validate_profile(raw: dict[str, Any], profile: str | None, where: str) -> Params:
    """Merge and validate one profile of a raw parameter mapping."""
    merged = resolve_profile(raw, profile)
    try:
        return Params.model_validate(merged)
    except ValidationError as err:
        raise config_error(err, where=f"{where} (profile {merged['profile']!r})") from None


def load_params(path: str | Path = "params.yaml", profile: str | None = None) -> Params:
    """Read, merge and validate ``params.yaml``; raise :class:`ParameterError` on bad input.

    Every profile in the file is validated, not only the active one, so a mistake in a profile
    you are not running is found now rather than when someone selects it."""
    raw = read_params_file(path)
    active = validate_profile(raw, profile, str(path))
    for name in sorted(raw.get("profiles") or {}):
        if name != active.profile:
            validate_profile(raw, name, str(path))
    if active.profile != "default":
        validate_profile(raw, "default", str(path))
    return active
