"""The one way a component declares its settings: a pydantic :class:`Section`.

Each component declares its configuration beside itself (``ModelConfig`` in ``model.py``,
``BaselineConfig`` in ``baseline/config.py``, ``ScapeConfig`` in ``scape/config.py``,
``RGCConfig`` in ``rgc/config.py``, the corpus specs in ``data/spec.py``); ``params.yaml`` composes
them (:mod:`lmrepro.pipeline.params`), and the command-line flags of a trainer are generated from
the same class (:func:`add_arguments`, :func:`from_arguments`, :func:`to_argv`): one source of
names, types, defaults and help.

Sections are strict (no coercion: ``'7'`` is not 7, ``yes`` is not 1), frozen and forbid unknown
keys, so a typo is an error instead of a silently ignored setting, naming the closest valid key
(``scape.sparsty_start = 0.5: unknown key; did you mean sparsity_start?``). Building one with bad
values raises :class:`lmrepro.errors.ConfigError` whose message names every key path, the value
and the rule, e.g. ``rgc.horizon = 5: must be an integer in [1, rgc.n_stages = 4]``; built from
flags (:func:`from_arguments`), it names the flags instead: ``--horizon = 5: ...``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from lmrepro.errors import ConfigError, ParameterError

__all__ = ["Section", "add_arguments", "config_error", "field_error", "from_arguments",
           "format_validation_error", "to_argv"]


def field_error(field: str, value: Any, allowed: str) -> ParameterError:
    """A cross-field rule's failure, worded like every other message: ``field = value: rule``.

    Raise it from a ``model_validator``; :func:`format_validation_error` prefixes the section's
    key path. It carries ``field``, ``value`` and ``allowed`` apart (a :class:`ParameterError`),
    so a command line can name the field by its flag (:func:`from_arguments`)."""
    return ParameterError(field, value, allowed)


def _shown(value: Any) -> str:
    shown = "{...}" if isinstance(value, dict) else repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _problem(e: Any) -> tuple[list[str], Any, str]:
    """One pydantic error as ``(key path, value, text)``, the line being the key path then
    ``text`` (`` = value: rule``); a cross-field rule (:func:`field_error`,
    :func:`lmrepro.errors.check`) at the key it names, with that key's value."""
    loc = [str(p) for p in e["loc"]]
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, ParameterError) and not isinstance(cause, ConfigError):
        return loc + str(cause.name).split("."), cause.value, \
            f" = {cause.value!r}: {cause.allowed}"
    # one wording for every rule: "must ..." (pydantic says "Input should ...")
    msg = str(e["msg"]).removeprefix("Value error, ").replace("Input should", "must")
    value = e.get("input")
    if e["type"] == "missing":          # pydantic's input is the whole mapping: not worth showing
        return loc, None, f": {'is required' if msg == 'Field required' else msg}"
    if e["type"] == "value_error" and isinstance(value, dict):
        return loc, value, f".{msg}"        # a model rule worded as a sentence of its own
    return loc, value, f" = {_shown(value)}: {msg}"


def _line(key: str, text: str) -> str:
    if key:
        return key + text
    return text[1:] if text.startswith(".") else "<top>" + text


def format_validation_error(err: ValidationError, prefix: str = "", where: str = "") -> str:
    """Every problem of ``err`` on its own line: ``[where: ]key.path = value: rule``."""
    lines = []
    for e in err.errors():
        path, _, text = _problem(e)
        line = _line(".".join([prefix] * bool(prefix) + path), text)
        lines.append(f"{where}: {line}" if where else line)
    return "\n".join(lines)


def config_error(err: ValidationError, prefix: str = "", where: str = "") -> ConfigError:
    """:class:`ConfigError` for a pydantic error: the first key path, its value, every line."""
    path, value, _ = _problem(err.errors()[0])
    key = ".".join([prefix] * bool(prefix) + path)
    return ConfigError(key, value, format_validation_error(err, prefix, where))


def _own_unknown(e: Any) -> bool:
    """Whether pydantic's error ``e`` is an unknown key of the section being validated (a nested
    section words its own)."""
    return e["type"] == "extra_forbidden" and len(e["loc"]) == 1


def _as_is(e: Any) -> Any:
    """Pydantic's error ``e`` as it can be raised again: type, message and context kept."""
    return {"type": PydanticCustomError(e["type"], e["msg"], e.get("ctx") or {}),
            "loc": e["loc"], "input": e["input"]}


class Section(BaseModel):
    """Base of every configuration class: strict, frozen, no unknown keys, clear errors.

    ``key`` is the section's path in ``params.yaml`` (``"rgc"``, ``"model"``): messages of a
    directly built section start with it, as they do when the whole file is validated.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              validate_default=True)
    key: ClassVar[str] = ""
    #: keys this section once had, each with what replaced it: an old key in a parameter file is
    #: refused with a one-line error naming the new key (never silently ignored or mapped)
    renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in cls.renamed.items():
                if old in data:
                    raise field_error(old, data[old], f"this key was renamed: {new}")
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _name_unknown_keys(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        # pydantic says "Extra inputs are not permitted" of a mistyped key: say which key was
        # meant (the closest field), or which keys there are; every other error unchanged
        try:
            return handler(data)
        except ValidationError as err:
            errors = err.errors()
            if not any(_own_unknown(e) for e in errors):
                raise
            raise ValidationError.from_exception_data(
                err.title, [cls._unknown_key(e) if _own_unknown(e) else _as_is(e)
                            for e in errors]) from None

    @classmethod
    def _unknown_key(cls, e: Any) -> Any:
        fields = list(cls.model_fields)
        near = difflib.get_close_matches(str(e["loc"][0]), fields, n=1)
        text = (f"unknown key; did you mean {near[0]}?" if near
                else f"unknown key (allowed: {', '.join(fields)})")
        return {"type": PydanticCustomError("unknown_key", text), "loc": e["loc"],
                "input": e["input"]}

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise config_error(err, self.key) from None

    # Marked as pydantic's own ``__init__`` (as ``RootModel`` does): a nested section is then
    # validated as a plain model and its errors keep their key paths for the outermost section to
    # word, instead of arriving as one pre-formatted message.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tuples become lists), as written into run records."""
        return json.loads(self.model_dump_json())

    def replace(self, **changes: Any) -> typing.Self:
        """A validated copy with ``changes`` applied."""
        return type(self)(**{**self.model_dump(), **changes})


# ------------------------------------------------------------------------------------------------
# command-line flags generated from a Section
# ------------------------------------------------------------------------------------------------

_ABSENT = object()


def _flag(name: str, prefix: str) -> str:
    return "--" + (prefix + name).replace("_", "-")


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """``(inner type, optional)`` of ``X | None``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _is_section(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def add_arguments(parser: argparse.ArgumentParser, cls: type[BaseModel], prefix: str = "",
                  exclude: typing.Collection[str] = ()) -> None:
    """One flag per field of ``cls`` (nested sections get ``--<field>-<subfield>`` flags).

    Flags default to "not given", so only what the user types overrides the section's own
    defaults (which :func:`from_arguments` then validates like any other input).
    """
    for name, field in cls.model_fields.items():
        if name in exclude:
            continue
        t, optional = _unwrap(field.annotation)
        if _is_section(t):
            add_arguments(parser, t, prefix=f"{prefix}{name}_")
            continue
        default = "required" if field.is_required() else f"default {field.default!r}"
        help_text = f"{field.description + '; ' if field.description else ''}{default}"
        kw: dict[str, Any] = {"dest": prefix + name, "default": _ABSENT, "help": help_text}
        origin = typing.get_origin(t)
        if t is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif origin is Literal:
            kw["choices"] = list(typing.get_args(t))
            kw["type"] = type(kw["choices"][0])
        elif origin is list:
            inner = typing.get_args(t)[0]
            kw["nargs"] = "+"
            kw["type"] = inner
        elif t in (int, float, str):
            kw["type"] = t
        else:
            kw["type"] = json.loads
            kw["help"] += " (JSON)"
        if optional and t is not bool:
            kw["help"] += "; 'null' for none"
            inner_type = kw.get("type", str)
            kw["type"] = (lambda s, f=inner_type: None if s == "null" else f(s))
            if "choices" in kw:
                kw["choices"].append(None)     # what the type makes of 'null'
        parser.add_argument(_flag(name, prefix), **kw)


def from_arguments(cls: type[Section], args: argparse.Namespace, base: dict | None = None,
                   prefix: str = "", exclude: typing.Collection[str] = ()) -> Any:
    """Build ``cls`` from the flags the user gave (over ``base``), validated; fields in
    ``exclude`` keep their defaults (as :func:`add_arguments` and :func:`to_argv` skip them)."""
    values: dict[str, Any] = dict(base or {})
    for name, field in cls.model_fields.items():
        if name in exclude:
            continue
        t, _ = _unwrap(field.annotation)
        if _is_section(t):
            nested = from_arguments(t, args, values.get(name), prefix=f"{prefix}{name}_")
            if nested is not None or name in values:
                values[name] = nested
            continue
        given = getattr(args, prefix + name, _ABSENT)
        if given is not _ABSENT:
            values[name] = given
    if prefix and not any(getattr(args, prefix + n, _ABSENT) is not _ABSENT
                          for n in cls.model_fields) and not base:
        return None
    try:
        return cls.model_validate(values)
    except ValidationError as err:
        raise _flag_error(err, cls, args, prefix, base) from None


def _dest_of(cls: type[BaseModel], path: list[str], prefix: str) -> str | None:
    """The ``dest`` of the flag :func:`add_arguments` made for key ``path`` of ``cls``; None
    where there is none (a key that is not a field)."""
    field = cls.model_fields.get(path[0]) if path else None
    if field is None:
        return None
    t, _ = _unwrap(field.annotation)
    if _is_section(t) and len(path) > 1:
        return _dest_of(t, path[1:], f"{prefix}{path[0]}_")
    return prefix + path[0]


def _in(base: Any, path: list[str]) -> bool:
    for key in path:
        if not isinstance(base, dict) or key not in base:
            return False
        base = base[key]
    return True


def _flag_error(err: ValidationError, cls: type[Section], args: argparse.Namespace,
                prefix: str, base: dict | None) -> ConfigError:
    """:func:`config_error` for a section built from flags: each problem named by the flag the
    user types (``--sparsity = 1.2: must be less than 1``), not by the key path it has in
    params.yaml; a value that came from ``base`` (not from a flag) keeps its key path."""
    lines, names, values = [], [], []
    for e in err.errors():
        path, value, text = _problem(e)
        dest = _dest_of(cls, path, prefix)
        if dest is not None and (getattr(args, dest, _ABSENT) is not _ABSENT
                                 or not _in(base, path)):
            name = "--" + dest.replace("_", "-")
        else:
            name = ".".join([cls.key] * bool(cls.key) + path)
        lines.append(_line(name, text))
        names.append(name)
        values.append(value)
    return ConfigError(names[0], values[0], "\n".join(lines))


def to_argv(obj: BaseModel, prefix: str = "", exclude: typing.Collection[str] = ()) -> list[str]:
    """The flags that rebuild ``obj`` with :func:`from_arguments` (every field, explicitly)."""
    argv: list[str] = []
    for name in type(obj).model_fields:
        if name in exclude:
            continue
        value = getattr(obj, name)
        if isinstance(value, BaseModel):
            argv += to_argv(value, prefix=f"{prefix}{name}_")
            continue
        flag = _flag(name, prefix)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is None:
            argv += [flag, "null"]
        elif isinstance(value, (list, tuple)):
            if value:
                argv += [flag, *map(str, value)]
            elif type(obj).model_fields[name].get_default(call_default_factory=True):
                # nargs="+" takes no empty list: one empty over a non-empty default is refused
                raise ValueError(f"{name}: an empty list cannot be passed as a flag over a "
                                 "non-empty default")
        elif isinstance(value, (int, float, str)):
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
        else:
            argv += [flag, json.dumps(value, sort_keys=True)]
    return argv
