"""The citable, self-contained HTML index of a run's reports, and its provenance record.

:func:`build_index` writes ``reports/index.html`` (one file, inline CSS, no external assets) that
links every rendered notebook HTML in the reports folder and records what produced them: the git
commit and dirty flag, ``params.yaml``, the prepared data's checksums (from each corpus's
``manifest.json``, format ``lmrepro.prepared/1``), the software versions, the machine and the date;
and a how-to-cite block (BibTeX ``@software`` and a plain citation) built from ``CITATION.cff``.
The same facts go to ``reports/provenance.json``. Both files are written atomically
(:mod:`lmrepro.io`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import html
import os
import platform
import re
import subprocess
import urllib.parse
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from lmrepro.data.prepare import FORMAT as MANIFEST_FORMAT
from lmrepro.errors import ParameterError, check
from lmrepro.io import atomic_write_json, atomic_write_text, read_json

PACKAGES = ("lmrepro", "torch", "numpy", "scipy", "pandas", "dvc")
PROVENANCE = "provenance.json"

# --------------------------------------------------------------------------------------------
# Provenance facts
# --------------------------------------------------------------------------------------------


def _run_git(repo_dir: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True,
                              text=True, timeout=30, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def git_info(repo_dir: str | os.PathLike) -> dict[str, Any]:
    """``{"commit", "dirty", "available", "note"}`` of the git checkout at ``repo_dir``.

    The commit comes from ``git rev-parse HEAD``; ``dirty`` is True when tracked files differ from
    it (``git --no-optional-locks status --porcelain --untracked-files=no``, which takes no lock
    and writes nothing). Outside a repository, without commits, or without git, ``commit`` and
    ``dirty`` are None and ``note`` says why.
    """
    repo_dir = Path(repo_dir)
    head = _run_git(repo_dir, "rev-parse", "--verify", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None, "available": False,
                "note": "git is not installed or did not answer"}
    if head.returncode != 0:
        inside = _run_git(repo_dir, "rev-parse", "--is-inside-work-tree")
        in_repo = inside is not None and inside.stdout.strip() == "true"
        note = ("git repository without commits" if in_repo
                else f"{repo_dir} is not inside a git repository")
        return {"commit": None, "dirty": None, "available": False, "note": note}
    status = _run_git(repo_dir, "--no-optional-locks", "status", "--porcelain",
                      "--untracked-files=no")
    dirty = None if status is None or status.returncode != 0 else bool(status.stdout.strip())
    return {"commit": head.stdout.strip(), "dirty": dirty, "available": True, "note": ""}


def package_versions(packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Python and package versions (``importlib.metadata``; ``"not installed"`` if absent)."""
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _total_memory_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil missing or unsupported platform: fall back to sysconf
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            return None


def machine_info() -> dict[str, Any]:
    """Platform, CPU count and total memory of this machine."""
    mem = _total_memory_bytes()
    return {
        "platform": platform.platform(), "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "python_implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(), "memory_total_bytes": mem,
        "memory_total_gib": None if mem is None else round(mem / (1 << 30), 2),
    }


def read_manifest(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows ``manifest, corpus, split, file, sha256, bytes`` of one prepared-data
    ``manifest.json`` (the ``lmrepro.prepared/1`` format of :mod:`lmrepro.data.prepare`): one per
    split, plus one per raw source file (``split`` = ``"raw"``, ``bytes`` None)."""
    path = Path(path)
    check(path.is_file(), "manifests", str(path), "must list existing manifest.json files")
    try:
        manifest = read_json(path)
    except ValueError as exc:
        raise ParameterError("manifests", str(path), f"must be valid JSON ({exc})") from exc
    check(isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT
          and isinstance(manifest.get("files"), dict), "manifests", str(path),
          f"must be a {MANIFEST_FORMAT} manifest (written by lmrepro.data.prepare)")
    corpus = str((manifest.get("source") or {}).get("corpus") or path.parent.name)
    rows = [{"manifest": str(path), "corpus": corpus, "split": split, "file": e["file"],
             "sha256": e["sha256"], "bytes": e["bytes"]} for split, e in manifest["files"].items()]
    rows += [{"manifest": str(path), "corpus": corpus, "split": "raw", "file": str(f),
              "sha256": str(h), "bytes": None}
             for f, h in sorted((manifest.get("raw_files") or {}).items())]
    return rows


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# Citation
# --------------------------------------------------------------------------------------------

def read_citation(path: str | os.PathLike) -> dict[str, Any]:
    """``CITATION.cff`` parsed with YAML (a mapping with at least ``title`` and ``authors``)."""
    path = Path(path)
    check(path.is_file(), "citation_path", str(path), "must be an existing CITATION.cff")
    try:
        cff = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ParameterError("citation_path", str(path), f"must be valid YAML ({exc})") from exc
    check(isinstance(cff, dict) and "title" in cff and cff.get("authors"), "citation_path",
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


def bibtex_entry(cff: dict[str, Any]) -> str:
    """A BibTeX ``@software`` entry for the software described by ``cff``."""
    year = _year(cff)
    first = re.sub(r"[^a-z0-9]", "", str(cff["title"]).split(":")[0].lower()) or "software"
    url = cff.get("url") or cff.get("repository-code")
    fields = [
        ("author", " and ".join(_person_bibtex(a) for a in cff["authors"])),
        ("title", "{" + _bibtex_escape(cff["title"]) + "}"),  # braces keep the capitals
        ("version", _bibtex_escape(cff.get("version") or "")),
        ("year", year),
        ("license", _bibtex_escape(cff.get("license") or "")),
        ("url", url),
        ("doi", cff.get("doi")),
    ]
    body = ",\n".join(f"  {k} = {{{v}}}" for k, v in fields if v)
    return f"@software{{{first}{year or ''},\n{body}\n}}"


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


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------

_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_H1 = re.compile(r"<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


def _clean(fragment: str) -> str:
    text = html.unescape(_TAG.sub("", fragment))
    return re.sub(r"\s+", " ", text).strip().rstrip("¶").strip()


def report_title(path: str | os.PathLike) -> str:
    """Title of a rendered notebook: its first ``<h1>``, else ``<title>``, else the file stem."""
    path = Path(path)
    head = path.read_text(encoding="utf-8", errors="replace")
    for pattern in (_H1, _TITLE):
        m = pattern.search(head)
        if m and _clean(m.group(1)):
            return _clean(m.group(1))
    return path.stem


def list_reports(reports_dir: str | os.PathLike, exclude: Sequence[Path] = ()) -> list[Path]:
    """Rendered HTML files directly in ``reports_dir``, sorted by name, minus ``exclude``."""
    skip = {p.resolve() for p in exclude}
    return sorted((p for p in Path(reports_dir).glob("*.html")
                   if p.is_file() and p.resolve() not in skip), key=lambda p: p.name)


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:980px;
margin:2em auto;padding:0 1em;color:#1b1b1b;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.3em}
h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #eee}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f5f5f5}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.88em}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:.7em;overflow-x:auto}
.dirty{color:#b00020;font-weight:bold}.clean{color:#1b7f3b}
.muted{color:#666}
""".strip()


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _git_html(git: dict[str, Any]) -> str:
    if not git["available"]:
        return f"<p>Commit: <span class=\"muted\">unknown ({_e(git['note'])})</span></p>"
    state = {True: ("dirty", "dirty: tracked files differ from the commit"),
             False: ("clean", "clean"), None: ("muted", "unknown")}[git["dirty"]]
    return (f"<p>Commit: <code>{_e(git['commit'])}</code> "
            f"<span class=\"{state[0]}\">({_e(state[1])})</span></p>")


def render_index(prov: dict[str, Any], links: Sequence[tuple[str, str]]) -> str:
    """The index page for provenance ``prov`` and ``(href, title)`` links (pure function)."""
    reports = ("<ul>" + "".join(f"<li><a href=\"{_e(href)}\">{_e(title)}</a> "
                                f"<span class=\"muted\">({_e(urllib.parse.unquote(href))})"
                                f"</span></li>" for href, title in links) + "</ul>"
               if links else "<p class=\"muted\">No rendered reports found.</p>")
    data_rows = [(r["corpus"], r["split"], r["file"], r["sha256"], r["bytes"], r["manifest"])
                 for r in prov["data"]]
    data = (_table(["corpus", "split", "file", "sha256", "bytes", "manifest"], data_rows)
            if data_rows else "<p class=\"muted\">No data manifests given.</p>")
    machine = prov["machine"]
    cite = prov["citation"]
    refs = "".join(f"<li>{_e(r)}</li>" for r in cite["references"])
    short = " ".join(x for x in (cite["title"].split(":")[0].strip(), cite.get("version")) if x)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(short)}: reports</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(short)}: reports</h1>
<p>{_e(cite['title'])}</p>
<p class="muted">Generated {_e(prov['generated_at'])}. Machine-readable copy:
<a href="{PROVENANCE}">{PROVENANCE}</a>.</p>
<h2>Reports</h2>
{reports}
<h2>Provenance</h2>
{_git_html(prov['git'])}
<h3>Parameters (<code>{_e(prov['params']['path'])}</code>, sha256
<code>{_e(prov['params']['sha256'])}</code>)</h3>
<pre>{_e(prov['params']['text'])}</pre>
<h3>Data checksums</h3>
{data}
<h3>Software</h3>
{_kv_table(list(prov['versions'].items()))}
<h3>Machine</h3>
{_kv_table([('platform', machine['platform']), ('machine', machine['machine']),
            ('processor', machine['processor']), ('CPU count', machine['cpu_count']),
            ('total memory (GiB)', machine['memory_total_gib'])])}
<h2>How to cite</h2>
<p>{_e(cite['plain'])}</p>
<pre>{_e(cite['bibtex'])}</pre>
<p>Please also cite the reproduced works:</p>
<ul>{refs}</ul>
</body>
</html>
"""


def build_index(reports_dir: str | os.PathLike, params_path: str | os.PathLike,
                manifests: Sequence[str | os.PathLike], citation_path: str | os.PathLike,
                out: str | os.PathLike = "reports/index.html", *,
                repo_dir: str | os.PathLike | None = None,
                now: _dt.datetime | None = None) -> Path:
    """Write the self-contained report index ``out`` and ``provenance.json`` beside it.

    Args:
        reports_dir: folder of rendered notebook HTML files (each linked, sorted by file name,
            titled by its first ``<h1>`` / ``<title>``; ``out`` itself is skipped).
        params_path: the run's ``params.yaml`` (shown verbatim and parsed into provenance.json).
        manifests: prepared-data ``manifest.json`` files (per-split sha256 and bytes).
        citation_path: ``CITATION.cff`` (parsed with YAML for the how-to-cite block).
        out: the index file to write.
        repo_dir: where to ask git for the commit (default: the current directory).
        now: the timestamp to record (default: the current UTC time).

    Returns:
        The path of the written index.
    """
    reports_dir, out = Path(reports_dir), Path(out)
    check(reports_dir.is_dir(), "reports_dir", str(reports_dir), "must be an existing folder")
    params_path = Path(params_path)
    check(params_path.is_file(), "params_path", str(params_path),
          "must be an existing params.yaml")
    params_text = params_path.read_text(encoding="utf-8")
    try:
        params = yaml.safe_load(params_text)
    except yaml.YAMLError as exc:
        raise ParameterError("params_path", str(params_path),
                             f"must be valid YAML ({exc})") from exc
    cff = read_citation(citation_path)
    data_rows = [row for m in manifests for row in read_manifest(m)]
    reports = list_reports(reports_dir, exclude=[out])
    out_dir = out.parent if str(out.parent) else Path(".")
    links = [(urllib.parse.quote(os.path.relpath(p, out_dir).replace(os.sep, "/")),
              report_title(p)) for p in reports]
    stamp = (now or _dt.datetime.now(_dt.UTC)).isoformat(timespec="seconds")
    prov = {
        "generated_at": stamp,
        "git": git_info(repo_dir if repo_dir is not None else Path.cwd()),
        "params": {"path": str(params_path), "sha256": _sha256_text(params_text),
                   "text": params_text, "content": params},
        "data": data_rows,
        "versions": package_versions(),
        "machine": machine_info(),
        "reports": [{"file": urllib.parse.unquote(h), "title": t} for h, t in links],
        "citation": {"title": str(cff["title"]), "version": cff.get("version"),
                     "bibtex": bibtex_entry(cff), "plain": plain_citation(cff),
                     "references": reference_citations(cff)},
    }
    atomic_write_json(out_dir / PROVENANCE, _jsonable(prov))
    atomic_write_text(out, render_index(prov, links))
    return out


def _jsonable(obj: Any) -> Any:
    """YAML may load dates; make everything JSON-serialisable (dates as ISO strings)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (_dt.date, _dt.datetime)):
        return obj.isoformat()
    return obj


def report_stage(params_file: str | Path = "params.yaml", reports_dir: str | Path = "reports",
                 profile: str | None = None) -> Path:
    """The ``report`` stage: ``reports/index.html`` over every rendered notebook, with the
    provenance of the active profile's prepared data and how to cite."""
    from lmrepro.pipeline.params import load_params

    params = load_params(params_file, profile)
    manifests = [Path(params.data.prepared_dir) / name / "manifest.json"
                 for name in params.data.use]
    return build_index(reports_dir, params_file, manifests, "CITATION.cff",
                       out=Path(reports_dir) / "index.html")
