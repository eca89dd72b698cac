"""Reading a parameter file: strict YAML (:func:`read_params_file`: a key given twice is refused,
a syntax error is one line naming the file, line and column) and its profiles
(:func:`resolve_profile`: the top level deep-merged with ``profiles[profile]``).

The schema that validates the result is :mod:`lmrepro.pipeline.params` (composed of the wings'
sections); this module is below it, so a component that reads one section itself (e.g. the data
commands, ``data:``) does not import the pipeline.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from lmrepro.errors import ParameterError


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
        return super().construct_mapping(node, deep=deep)


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
