"""Citations from ``CITATION.cff``: BibTeX and plain-text entries of the software (with the
repository URL and commit it was run at) and of the works it reproduces (``references:``).
Nothing is made up: authors, years or identifiers the file does not know are left out and the
entry says so."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from lmrepro.errors import ParameterError, check

__all__ = ["bibtex_entry", "plain_citation", "read_citation", "reference_bibtex",
           "reference_citations"]


def read_citation(path: str | os.PathLike) -> dict[str, Any]:
    """``CITATION.cff`` parsed with YAML (a mapping with at least ``title`` and ``authors``)."""
    path = Path(path)
    check(path.is_file(), "citation_path", str(path), "must be an existing CITATION.cff")
    try:
        cff = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ParameterError("citation_path", str(path), f"must be valid YAML ({exc})") from exc
    check(isinstance(cff, dict) and "title" in cff and bool(cff.get("authors")), "citation_path",
          str(path), "must be a CITATION.cff mapping with 'title' and 'authors'")
    return cff


def _person_plain(a: dict[str, Any]) -> str:
    if "family-names" in a:
        return " ".join(x for x in (a.get("given-names"), a.get("name-particle"),
                                    a["family-names"]) if x)
    return str(a.get("name", "Anonymous"))


def _person_bibtex(a: dict[str, Any]) -> str:
    if "family-names" in a:
        family = " ".join(x for x in (a.get("name-particle"), a["family-names"]) if x)
        given = a.get("given-names")
        return f"{family}, {given}" if given else family
    return "{" + str(a.get("name", "Anonymous")) + "}"  # an entity: keep its name whole


def _bibtex_escape(text: str) -> str:
    return re.sub(r"([&%$#_])", r"\\\1", str(text))


def _year(cff: dict[str, Any]) -> str | None:
    date = cff.get("date-released")
    if date is None:
        return None
    return str(date)[:4]


def bibtex_entry(cff: dict[str, Any], *, url: str | None = None,
                 commit: str | None = None) -> str:
    """A BibTeX ``@software`` entry for the software described by ``cff``: its repository URL
    (``url``, else ``repository-code`` / ``url`` of ``cff``) and the ``commit`` it was run at."""
    year = _year(cff)
    first = re.sub(r"[^a-z0-9]", "", str(cff["title"]).split(":")[0].lower()) or "software"
    url = url or cff.get("repository-code") or cff.get("url")
    fields = [
        ("author", " and ".join(_person_bibtex(a) for a in cff["authors"])),
        ("title", "{" + _bibtex_escape(cff["title"]) + "}"),  # braces keep the capitals
        ("version", _bibtex_escape(cff.get("version") or "")),
        ("year", year),
        ("license", _bibtex_escape(cff.get("license") or "")),
        ("url", url),
        ("doi", cff.get("doi")),
        ("note", f"git commit {commit}" if commit else None),
    ]
    body = ",\n".join(f"  {k} = {{{v}}}" for k, v in fields if v)
    return f"@software{{{first}{year or ''},\n{body}\n}}"


_UNKNOWN_AUTHORS = re.compile(r"^\s*(unknown|authors of)\b", re.IGNORECASE)


def _authors_known(ref: dict[str, Any]) -> bool:
    """False when the reference names no person and no real entity (e.g. ``name: Authors of
    the RGC paper``, ``name: unknown``): its authors are unknown to us."""
    authors = ref.get("authors") or []
    return bool(authors) and not all("family-names" not in a
                                     and _UNKNOWN_AUTHORS.match(str(a.get("name", "")))
                                     for a in authors)


def reference_bibtex(ref: dict[str, Any]) -> str:
    """A BibTeX ``@misc`` entry of a work under ``references:`` of ``CITATION.cff``: authors,
    title, year, the arXiv identifier as ``eprint``, the URL and the reference's notes. Authors,
    year or identifier that the file does not know are left out and the note says so (nothing
    is made up)."""
    known = _authors_known(ref)
    first = next((a["family-names"] for a in ref.get("authors") or [] if "family-names" in a),
                 None) if known else None
    word = re.sub(r"[^a-z0-9]", "", str(ref.get("title", "")).split()[0].lower()) or "work"
    year = str(ref["year"]) if ref.get("year") else None
    key = "".join(re.sub(r"[^a-z0-9]", "", x.lower()) for x in (first or "", year or "")) + word
    arxiv = next((str(i["value"]).removeprefix("arXiv:") for i in ref.get("identifiers") or []
                  if str(i.get("value", "")).startswith("arXiv:")), None)
    missing = [what for what, have in (("authors", known), ("year", year),
                                       ("identifier", arxiv or ref.get("doi"))) if not have]
    notes = " ".join(str(ref.get("notes", "")).split())
    if missing:
        notes = (f"{', '.join(missing).capitalize()} unknown to the lmrepro authors. "
                 + notes).strip()
    fields = [
        ("author", " and ".join(_person_bibtex(a) for a in ref["authors"]) if known else None),
        ("title", "{" + _bibtex_escape(ref.get("title", "")) + "}"),
        ("year", year),
        ("eprint", arxiv), ("archivePrefix", "arXiv" if arxiv else None),
        ("doi", ref.get("doi")),
        ("url", ref.get("url")),
        ("note", _bibtex_escape(notes) if notes else None),
    ]
    body = ",\n".join(f"  {k} = {{{v}}}" for k, v in fields if v)
    return f"@misc{{{key},\n{body}\n}}"


def plain_citation(cff: dict[str, Any]) -> str:
    """``Authors (Year). Title (Version v) [Computer software]. License. URL``."""
    authors = ", ".join(_person_plain(a) for a in cff["authors"])
    year = _year(cff)
    text = f"{authors}" + (f" ({year})" if year else "") + f". {cff['title']}"
    if cff.get("version"):
        text += f" (Version {cff['version']})"
    text += " [Computer software]."
    if cff.get("license"):
        text += f" License: {cff['license']}."
    url = cff.get("url") or cff.get("repository-code")
    if url:
        text += f" {url}"
    return text


def reference_citations(cff: dict[str, Any]) -> list[str]:
    """Plain citations of the works listed under ``references:`` (the reproduced papers)."""
    out = []
    for ref in cff.get("references") or []:
        authors = ", ".join(_person_plain(a) for a in ref.get("authors") or [])
        text = f"{authors}" + (f" ({ref['year']})" if ref.get("year") else "")
        text += f". {ref.get('title', '')}."
        ids = [i.get("value") for i in ref.get("identifiers") or [] if i.get("value")]
        if ids:
            text += " " + ", ".join(str(i) for i in ids) + "."
        if ref.get("url"):
            text += f" {ref['url']}"
        out.append(text.strip())
    return out
