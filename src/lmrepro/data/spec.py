"""The ``data:`` section of ``params.yaml``: :class:`DataConfig` and the corpus specs.

A corpus is one of three kinds, each a :class:`lmrepro.config.Section` with exactly its keys
and their defaults (the defaults of enwik8 and the embedded corpus are the pinned checksums):

* :class:`EmbeddedSpec` (``kind: embedded``): a text file installed at set-up;
* :class:`Enwik8Spec` (``kind: enwik8``): ``enwik8.zip``, pinned zip and payload;
* :class:`HfSpec` (``kind: hf``): a text column of a Hugging Face dataset (hub id or local copy).

:data:`CorpusSpec` is their union, told apart by ``kind``. A single raw stream is cut into
train/val/test by ``split_bytes`` or ``split_fractions`` (never both); when neither is given the
kind's default is filled in, so the validated spec is the complete rule that the prepared
manifest records. Messages name the key path, the value and the rule, e.g.
``data.corpora.enwik8.sha256 = 'xyz': must be a 64-character hex sha256 digest or null``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (AfterValidator, BeforeValidator, Field, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from lmrepro.config import Section
from lmrepro.data.embedded import EMBEDDED_DIR, FILE_NAME, SHAKESPEARE_TXT_SHA256
from lmrepro.data.prepare import (DEFAULT_SPLIT_BYTES, DEFAULT_SPLIT_FRACTIONS, SPLIT_BYTES_RULE,
                                  SPLIT_FRACTIONS_RULE, valid_split_bytes, valid_split_fractions)
from lmrepro.errors import ParameterError, check

__all__ = [
    "DEFAULT_SEPARATOR", "ENWIK8_RAW_BYTES", "ENWIK8_RAW_SHA1", "ENWIK8_RAW_SHA256", "ENWIK8_URL",
    "ENWIK8_ZIP_BYTES", "ENWIK8_ZIP_SHA256", "KINDS", "CorpusSpec", "DataConfig", "EmbeddedSpec",
    "Enwik8Spec", "HfSpec", "corpus_key",
]

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
#: sha256 of ``enwik8.zip`` as served by mattmahoney.net (36,445,475 bytes). Not published by the
#: author (he publishes MD5/SHA-1 of the unzipped file); corroborated by several independent
#: projects. Mirrors that re-pack the archive change it: set ``sha256: null`` for such a mirror
#: and rely on :data:`ENWIK8_RAW_SHA256` (the payload check), which does not depend on packing.
ENWIK8_ZIP_SHA256 = "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
ENWIK8_ZIP_BYTES = 36_445_475
#: sha256 of the unzipped 100,000,000-byte ``enwik8``.
ENWIK8_RAW_SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
#: Published by the author (http://mattmahoney.net/dc/textdata.html); documented, not checked.
ENWIK8_RAW_SHA1 = "57b8363b814821dc9d47aa4d41f58733519076b2"
ENWIK8_RAW_BYTES = 100_000_000

#: Separator between documents in the byte stream of an ``hf`` corpus: a blank line.
DEFAULT_SEPARATOR = "\n\n"


# ------------------------------------------------------------------------------------------------
# field rules, worded as the data layer has always worded them


def _rule(ok: Callable[[Any], bool], allowed: str) -> BeforeValidator:
    """Reject a value unless ``ok(value)``, with ``allowed`` as the message."""
    def validate(value: Any) -> Any:
        if not ok(value):
            raise ValueError(allowed)
        return value
    return BeforeValidator(validate)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(allowed: str) -> Any:
    return Annotated[str, _rule(lambda v: isinstance(v, str) and v != "", allowed)]


_Name = _text("must be a string (non-empty)")
_FilePath = _text("must be the path of a text file")
_ZipUrl = _text("must be an http(s):// or file:// URL or a local path of enwik8.zip")
_Member = _text("must be the name of the file inside the zip")
_Source = _text("must be a hub id (owner/name) or a local dataset path")
_OptionalText = Annotated[str | None, _rule(lambda v: v is None or isinstance(v, str) and v != "",
                                            "must be a non-empty string or null")]
_Sha256 = Annotated[str | None,
                    _rule(lambda v: v is None or isinstance(v, str)
                          and re.fullmatch(r"[0-9a-fA-F]{64}", v) is not None,
                          "must be a 64-character hex sha256 digest or null"),
                    AfterValidator(lambda v: None if v is None else v.lower())]
_Bytes = Annotated[int | None, _rule(lambda v: v is None or _is_int(v) and v > 0,
                                     "must be a positive integer (bytes) or null")]
_SplitBytes = Annotated[list[int] | None,
                        _rule(lambda v: v is None or valid_split_bytes(v), SPLIT_BYTES_RULE)]
_SplitFractions = Annotated[list[float] | None, _rule(lambda v: v is None
                                                      or valid_split_fractions(v),
                                                      SPLIT_FRACTIONS_RULE)]
_Seconds = Annotated[float, _rule(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and v > 0, "must be a positive number of seconds")]
_Flag = Annotated[bool, _rule(lambda v: isinstance(v, bool), "must be true or false")]
_CorpusName = Annotated[str, _rule(lambda v: isinstance(v, str)
                                   and re.fullmatch(r"[A-Za-z0-9_.-]+", v) is not None,
                                   "corpus names are letters, digits, '_', '-', '.'")]


# ------------------------------------------------------------------------------------------------
# the corpus kinds


class _Corpus(Section):
    """What every kind has: the rule that cuts a single raw stream into train/val/test."""

    #: the rule filled in when a spec gives neither ``split_bytes`` nor ``split_fractions``
    default_split: ClassVar[dict[str, list]] = {}

    split_bytes: _SplitBytes = Field(None, description="train, val, test bytes, in order")
    split_fractions: _SplitFractions = Field(
        None, description="train, val, test shares: floor(f * n) bytes, test the rest")

    @model_validator(mode="before")
    @classmethod
    def _fill_default_split(cls, data: Any) -> Any:
        if (isinstance(data, dict) and data.get("split_bytes") is None
                and data.get("split_fractions") is None and cls._cuts_one_stream(data)):
            return {**data, **cls.default_split}
        return data

    @classmethod
    def _cuts_one_stream(cls, data: dict) -> bool:
        return True

    @model_validator(mode="after")
    def _one_split_rule(self) -> _Corpus:
        check(self.split_bytes is None or self.split_fractions is None, "split_bytes",
              self.split_bytes, "give split_bytes or split_fractions, not both")
        return self


class EmbeddedSpec(_Corpus):
    """A text file installed at set-up (default: the Shakespeare corpus), read where it lies."""

    default_split: ClassVar[dict[str, list]] = {"split_fractions": list(DEFAULT_SPLIT_FRACTIONS)}

    kind: Literal["embedded"] = "embedded"
    path: _FilePath = f"{EMBEDDED_DIR}/{FILE_NAME}"
    sha256: _Sha256 = Field(SHAKESPEARE_TXT_SHA256, description="pin of the file; null: none")


class Enwik8Spec(_Corpus):
    """``enwik8.zip`` from a URL, a ``file://`` URL or a local path; zip and payload pinned."""

    default_split: ClassVar[dict[str, list]] = {"split_bytes": list(DEFAULT_SPLIT_BYTES)}

    kind: Literal["enwik8"] = "enwik8"
    url: _ZipUrl = ENWIK8_URL
    sha256: _Sha256 = Field(ENWIK8_ZIP_SHA256, description="pin of the zip; null for a mirror "
                            "that re-packs it")
    raw_sha256: _Sha256 = Field(ENWIK8_RAW_SHA256, description="pin of the unzipped member")
    raw_bytes: _Bytes = ENWIK8_RAW_BYTES
    member: _Member = "enwik8"
    timeout: _Seconds = Field(60.0, description="of the download connection")

    @model_validator(mode="after")
    def _pinned(self) -> Enwik8Spec:
        check(self.sha256 is not None or self.raw_sha256 is not None, "sha256", None,
              "pin at least one of sha256 (zip) and raw_sha256 (unzipped)")
        return self


class HfSpec(_Corpus):
    """A text column of a Hugging Face dataset, from the hub or a local copy.

    Without ``val_split`` the ``train_split`` is one stream cut by the split rule; with it each
    split is its own file (``test_split`` optional: else val is cut in two) and no rule is set.
    """

    default_split: ClassVar[dict[str, list]] = {"split_fractions": list(DEFAULT_SPLIT_FRACTIONS)}

    kind: Literal["hf"] = "hf"
    source: _Source
    config_name: _OptionalText = None
    revision: _OptionalText = Field(None, description="hub commit or tag (reproducible stream)")
    text_field: _Name = "text"
    train_split: _Name = "train"
    val_split: _OptionalText = None
    test_split: _OptionalText = None
    streaming: _Flag = Field(False, description="read the hub dataset as a stream")
    byte_budget: _Bytes = Field(None, description="stop before the document that exceeds it")
    val_byte_budget: _Bytes = None
    separator: str = DEFAULT_SEPARATOR

    @classmethod
    def _cuts_one_stream(cls, data: dict) -> bool:
        return data.get("val_split") is None

    @model_validator(mode="after")
    def _splits(self) -> HfSpec:
        if self.val_split is None:
            check(self.test_split is None, "test_split", self.test_split, "needs val_split")
            check(self.val_byte_budget is None, "val_byte_budget", self.val_byte_budget,
                  "needs val_split")
        else:
            rule = "split_bytes" if self.split_bytes is not None else "split_fractions"
            check(getattr(self, rule) is None, rule, getattr(self, rule),
                  "must be unset when val_split is given (each split is its own file)")
        return self

    def roles(self) -> list[tuple[str, str, int | None]]:
        """``(role, split, byte budget)`` of each file: ``all`` (one stream to cut), or
        ``train``, ``val`` and, with ``test_split``, ``test``."""
        if self.val_split is None:
            return [("all", self.train_split, self.byte_budget)]
        roles = [("train", self.train_split, self.byte_budget),
                 ("val", self.val_split, self.val_byte_budget)]
        if self.test_split is not None:
            roles.append(("test", self.test_split, self.val_byte_budget))
        return roles


CorpusSpec = Annotated[EmbeddedSpec | Enwik8Spec | HfSpec, Field(discriminator="kind")]
_SPECS: dict[str, type[_Corpus]] = {c.model_fields["kind"].default: c
                                    for c in (EmbeddedSpec, Enwik8Spec, HfSpec)}
KINDS = tuple(_SPECS)


# ------------------------------------------------------------------------------------------------
# the data: section


class DataConfig(Section):
    """Where data lives and which corpora the active profile fetches and prepares."""

    key: ClassVar[str] = "data"

    raw_dir: str = Field("data/raw", description="downloads and fetched text (cached)")
    prepared_dir: str = Field("data/prepared", description="train/val/test.bin + manifest.json")
    embedded_dir: str = Field(EMBEDDED_DIR, description="the offline corpus of set-up")
    use: list[str] = Field(min_length=1, description="corpora this profile fetches and prepares")
    corpora: dict[_CorpusName, CorpusSpec] = Field(min_length=1)

    @field_validator("corpora", mode="wrap")
    @classmethod
    def _errors_at_corpus_keys(cls, value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError as err:
            raise ValidationError.from_exception_data(
                err.title, [_at_corpus_key(e, value) for e in err.errors()]) from None

    @model_validator(mode="after")
    def _use_known(self) -> DataConfig:
        for i, name in enumerate(self.use):
            check(name in self.corpora, f"use[{i}]", name, "is not a corpus defined under "
                  f"data.corpora (known: {sorted(self.corpora)})")
        return self


def corpus_key(name: str) -> str:
    """The key path of a corpus in ``params.yaml``, as messages name it."""
    return f"{DataConfig.key}.corpora.{name}"


def _at_corpus_key(e: Any, corpora: Any) -> dict[str, Any]:
    """One error of ``corpora`` addressed to ``<name>.<key>`` and worded for a corpus spec.

    Pydantic puts the union tag between the two (``enwik8.enwik8.sha256``) and reports a
    cross-field rule at the spec; here it is at the key the rule names, with that key's value.
    """
    name, *rest = e["loc"] or (None,)
    raw = corpora.get(name) if isinstance(corpora, dict) else None
    kind = raw.get("kind") if isinstance(raw, dict) else None
    rest = rest[1:] if rest[:1] == [kind] else [] if rest == ["[key]"] else rest
    value, text, cause = e["input"], e["msg"], e.get("ctx", {}).get("error")
    if isinstance(cause, ParameterError):
        rest, value, text = [*rest, cause.name], cause.value, cause.allowed
    elif isinstance(cause, ValueError):
        text = str(cause)
    elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
        rest, value, text = ["kind"], kind, f"must be one of {list(KINDS)}"
    elif e["type"] == "missing":
        value, text = None, f"is required for a corpus of kind {kind!r}"
    elif e["type"] == "model_attributes_type":
        text = "must be a mapping with at least 'kind'"
    loc = tuple(p for p in (name, *rest) if p is not None)
    return {"type": PydanticCustomError(e["type"], text), "loc": loc, "input": value}
