"""The citable, self-contained HTML index of a run's reports, and its provenance record.

:func:`build_index` writes ``reports/index.html`` (one file, inline CSS, the forest plot embedded
as a ``data:`` URI, no external assets). It opens with **Results at a glance**: one sentence on
the scale of this run, then one row per claim (the claim, the paper's figure and scale, ours and
our scale, the verdict and its caveats, from ``results/analysis/claims.csv``) and the forest plot
of every non-inferiority comparison (``results/analysis/forest.png``). Then the reports (each
rendered notebook, with how long its stage ran, from papermill's record in the executed
notebook), how to cite (BibTeX of the software with its repository URL and commit, and of the
reproduced papers, from ``CITATION.cff``), and the provenance: the git commit and dirty flag, the
machine (CPU model, cores, memory), the software versions, the sha256 of the result files and of
the prepared data (each corpus's ``manifest.json``, format ``lmrepro.prepared/1``), and
``params.yaml`` in a collapsed section. The same facts go to ``reports/provenance.json``. Both
files are written atomically (:mod:`lmrepro.io`).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import html
import json
import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from lmrepro.data.prepare import FORMAT as MANIFEST_FORMAT
from lmrepro.errors import ParameterError, check
from lmrepro.io import atomic_write_json, atomic_write_text, read_json, sha256_file
from lmrepro.pipeline import registry
from lmrepro.pipeline.citation import (bibtex_entry, plain_citation, read_citation,
                                       reference_bibtex, reference_citations)
from lmrepro.pipeline.provenance import git_info, git_remote_url, machine_info, package_versions

__all__ = ["PROVENANCE", "analyses", "build_index", "read_manifest", "render_index",
           "report_stage", "result_files", "scale_sentence", "stage_durations"]

PROVENANCE = "provenance.json"
CLAIMS_CSV = "results/analysis/claims.csv"
FOREST_PNG = "results/analysis/forest.png"
RESOLVED_PARAMS = "results/params.json"


def analyses() -> tuple[str, ...]:
    """The ``analysis.json`` files the wings declare
    (:class:`lmrepro.pipeline.registry.Report`)."""
    return tuple(f for r in registry.reports() for f in r.analyses)


def result_files() -> tuple[str, ...]:
    """The result files whose sha256 the index records (those that exist), relative to the root:
    the resolved parameters, the wings' training metrics, their analyses, the claims table, its
    metric and the forest plot, then the wings' other files."""
    reports = registry.reports()
    return (RESOLVED_PARAMS, *(f for r in reports for f in r.metrics), *analyses(),
            CLAIMS_CSV, "results/analysis/claims.json", FOREST_PNG,
            *(f for r in reports for f in r.extra))


# --------------------------------------------------------------------------------------------
# Provenance facts
# --------------------------------------------------------------------------------------------


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
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1150px;
margin:2em auto;padding:0 1em;color:#1b1b1b;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.3em}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #eee}
h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em;max-width:100%}
th,td{border:1px solid #ddd;padding:.25em .55em;text-align:left;vertical-align:top;
overflow-wrap:break-word}
td.hash{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.82em;
overflow-wrap:anywhere;min-width:16ch}
th{background:#f5f5f5}
.lmrepro-table{max-width:100%;overflow-x:auto}
.lmrepro-table td{max-width:26em}.lmrepro-table td.long{overflow-wrap:anywhere}
.lmrepro-table td.num{text-align:right;white-space:nowrap}
td[class*="verdict-"]{min-width:7.5em}
td.verdict-reproduced{background:#e3f4e6;font-weight:600}
td.verdict-consistent-with-the-authors-logs{background:#e6eefb;font-weight:600}
td.verdict-not-measured-in-the-authors-logs{background:#f3f3f3}
td.verdict-not-reproduced{background:#fbe4e4;font-weight:600}
td.verdict-inconclusive{background:#fff4d6;font-weight:600}
td.verdict-reproduced-in-direction-only{background:#eef6e0;font-weight:600}
td.verdict-not-run{color:#777}
.glance td{max-width:34em}.legend td{max-width:60em}ol.notes li{margin:.25em 0}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.86em}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:.7em;white-space:pre-wrap;
overflow-wrap:anywhere}
details{margin:.6em 0}summary{cursor:pointer;font-weight:600}
img.figure{max-width:100%;height:auto;border:1px solid #eee}
.scale{font-size:1.02em;background:#f6f8fa;border-left:4px solid #8aa;padding:.5em .8em}
.dirty{color:#b00020;font-weight:bold}.clean{color:#1b7f3b}
.muted{color:#666}
""".strip()


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain table; ``sha256`` cells are monospaced and wrap anywhere (the page must fit a
    window without scrolling sideways)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    cls = ["" if h != "sha256" else ' class="hash"' for h in header]
    body = "".join("<tr>" + "".join(f"<td{k}>{_e(c)}</td>" for k, c in zip(cls, row, strict=True))
                   + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _git_html(git: dict[str, Any]) -> str:
    if not git["available"]:
        return f"<p>Commit: <span class=\"muted\">unknown ({_e(git['note'])})</span></p>"
    state = {True: ("dirty", "dirty: tracked files differ from the commit"),
             False: ("clean", "clean"), None: ("muted", "unknown")}[git["dirty"]]
    return (f"<p>Commit: <code>{_e(git['commit'])}</code> "
            f"<span class=\"{state[0]}\">({_e(state[1])})</span></p>")


# --------------------------------------------------------------------------------------------
# Results at a glance
# --------------------------------------------------------------------------------------------

GLANCE_COLUMNS = ["claim", "paper_figure", "paper_scale", "measured", "our_scale", "verdict",
                  "caveats"]


def stage_durations(reports: Sequence[Path]) -> dict[str, float | None]:
    """Seconds each report's notebook ran, from papermill's ``metadata.papermill.duration`` in
    the executed notebook beside it (``NN_name.ipynb``); None when there is none."""
    out: dict[str, float | None] = {}
    for report in reports:
        executed = report.with_suffix(".ipynb")
        duration = None
        if executed.is_file():
            try:
                meta = json.loads(executed.read_text(encoding="utf-8")).get("metadata", {})
                raw = (meta.get("papermill") or {}).get("duration")
                duration = None if raw is None else float(raw)
            except (ValueError, TypeError):
                duration = None
        out[report.name] = duration
    return out


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = int(round(seconds))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def scale_sentence(params: Mapping[str, Any] | None, machine: Mapping[str, Any],
                   n_params: Mapping[str, int] | None = None) -> str:
    """One sentence on the scale of this run: profile, seeds, corpora, each suite's model, steps
    and compute, and the machine (pure: from the resolved parameters and the machine facts;
    ``n_params``: the largest parameter count per stage, from the analyses)."""
    where = (f"{machine.get('usable_cores') or machine.get('cpu_count')} cores of an "
             f"{machine.get('cpu_model') or machine.get('processor') or 'unknown CPU'}")
    if not params:
        return f"No resolved parameters were found (results/params.json); machine: {where}."
    n_params = n_params or {}
    seeds = params.get("seeds") or []
    parts = [part for r in sorted(registry.reports(), key=lambda r: r.rank) if r.scale
             and (part := r.scale(params, n_params))]
    n = len(seeds)
    return (f"This run (profile {params.get('profile', '?')!r}, {n} training seed"
            f"{'s' * (n != 1)} {', '.join(str(x) for x in seeds)}) is small next to the papers': "
            + "; ".join(parts) + f"; on {where}.")


def _glance_html(claims: Any, forest_png: bytes | None) -> str:
    from lmrepro.pipeline.glance import claims_html

    if claims is None:
        table = ("<p class=\"muted\">No claims yet: results/analysis/claims.csv is made by the "
                 "claims stage (<code>dvc repro</code>).</p>")
    else:
        table = claims_html(claims)
    figure = ""
    if forest_png:
        data = base64.b64encode(forest_png).decode("ascii")
        figure = ("<h3>Every non-inferiority comparison</h3><p>Mean relative difference in eval "
                  "loss (dot: green when non-inferior, orange when not) and the one-sided upper "
                  "bound U the verdict uses (bar end), against the margin (red line): a "
                  "comparison is non-inferior when U is left of the margin.</p>"
                  f"<img class=\"figure\" alt=\"forest plot of the non-inferiority comparisons\" "
                  f"src=\"data:image/png;base64,{data}\">")
    return table + figure


def render_index(prov: dict[str, Any], claims: Any = None, forest_png: bytes | None = None
                 ) -> str:
    """The index page for provenance ``prov`` (with its ``reports`` links), the claims table
    ``claims`` (a DataFrame of :data:`lmrepro.pipeline.claims.CLAIM_COLUMNS`, or None) and the
    forest plot's PNG bytes (pure function)."""
    links = prov["reports"]
    reports = ("<ul>" + "".join(
        f"<li><a href=\"{_e(r['href'])}\">{_e(r['title'])}</a> "
        f"<span class=\"muted\">({_e(r['file'])}; stage ran {_e(_duration(r['duration_s']))})"
        f"</span></li>" for r in links) + "</ul>"
        if links else "<p class=\"muted\">No rendered reports found.</p>")
    data_rows = [(r["corpus"], r["split"], r["file"], r["sha256"], r["bytes"], r["manifest"])
                 for r in prov["data"]]
    data = (_table(["corpus", "split", "file", "sha256", "bytes", "manifest"], data_rows)
            if data_rows else "<p class=\"muted\">No data manifests given.</p>")
    results = (_table(["file", "sha256", "bytes"],
                      [(r["file"], r["sha256"], r["bytes"]) for r in prov["results"]])
               if prov["results"] else "<p class=\"muted\">No result files found.</p>")
    machine = prov["machine"]
    cite = prov["citation"]
    refs = "".join(f"<li>{_e(r)}</li>" for r in cite["references"])
    ref_bib = "\n\n".join(cite["references_bibtex"])
    short = " ".join(x for x in (cite["title"].split(":")[0].strip(), cite.get("version")) if x)
    url_note = ("" if cite.get("url") else "<p class=\"muted\">The repository URL is not "
                "recorded: set <code>repository-code</code> in CITATION.cff (or a git remote "
                "<code>origin</code>).</p>")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(short)}: results and reports</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(short)}: results and reports</h1>
<p>{_e(cite['title'])}</p>
<p class="muted">Generated {_e(prov['generated_at'])}. Machine-readable copy:
<a href="{PROVENANCE}">{PROVENANCE}</a>.</p>
<h2>Results at a glance</h2>
<p class="scale">{_e(prov['scale'])}</p>
{_glance_html(claims, forest_png)}
<h2>Reports</h2>
{reports}
<h2>How to cite</h2>
<p>{_e(cite['plain'])}</p>
<pre>{_e(cite['bibtex'])}</pre>
{url_note}
<p>Please also cite the reproduced works:</p>
<ul>{refs}</ul>
<pre>{_e(ref_bib)}</pre>
<h2>Provenance</h2>
{_git_html(prov['git'])}
<h3>Machine</h3>
{_kv_table([('CPU model', machine.get('cpu_model')), ('CPU count', machine['cpu_count']),
            ('usable cores', machine.get('usable_cores')), ('platform', machine['platform']),
            ('machine', machine['machine']),
            ('total memory (GiB)', machine['memory_total_gib'])])}
<h3>Software</h3>
{_kv_table(list(prov['versions'].items()))}
<h3>Result files (sha256)</h3>
{results}
<h3>Data checksums</h3>
{data}
<details><summary>Parameters: <code>{_e(prov['params']['path'])}</code>, sha256
<code>{_e(prov['params']['sha256'])}</code></summary>
<pre>{_e(prov['params']['text'])}</pre>
</details>
</body>
</html>
"""


def _read_claims(path: Path | None) -> Any:
    if path is None or not path.is_file():
        return None
    import pandas as pd

    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def _analysis_n_params(paths: Sequence[Path]) -> dict[str, int]:
    out = {}
    for path in paths:
        if path.is_file():
            try:
                data = read_json(path)
                out[str(data.get("stage"))] = max(int(r.get("n_params") or 0)
                                                  for r in data.get("runs") or [{}])
            except (ValueError, TypeError, AttributeError):
                continue
    return out


def _read_params(path: Path) -> tuple[str, Any]:
    """``params.yaml``'s text and its parsed content."""
    check(path.is_file(), "params_path", str(path), "must be an existing params.yaml")
    text = path.read_text(encoding="utf-8")
    try:
        return text, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParameterError("params_path", str(path), f"must be valid YAML ({exc})") from exc


def _report_rows(reports: Sequence[Path], out_dir: Path) -> list[dict[str, Any]]:
    """One row per rendered report: link relative to the index, title, its stage's wall time."""
    durations = stage_durations(reports)
    rows = []
    for p in reports:
        rel = os.path.relpath(p, out_dir).replace(os.sep, "/")
        rows.append({"href": urllib.parse.quote(rel), "file": rel, "title": report_title(p),
                     "duration_s": durations[p.name]})
    return rows


def _citation_block(cff: dict[str, Any], url: str | None, commit: str | None) -> dict[str, Any]:
    """How to cite: the software (at ``url`` and ``commit``) and the works it reproduces."""
    return {"title": str(cff["title"]), "version": cff.get("version"), "url": url,
            "bibtex": bibtex_entry(cff, url=url, commit=commit), "plain": plain_citation(cff),
            "references": reference_citations(cff),
            "references_bibtex": [reference_bibtex(r) for r in cff.get("references") or []]}


def build_index(reports_dir: str | os.PathLike, params_path: str | os.PathLike,
                manifests: Sequence[str | os.PathLike], citation_path: str | os.PathLike,
                out: str | os.PathLike = "reports/index.html", *,
                repo_dir: str | os.PathLike | None = None,
                now: _dt.datetime | None = None,
                claims_csv: str | os.PathLike | None = None,
                forest_png: str | os.PathLike | None = None,
                resolved_params: str | os.PathLike | None = None,
                result_files: Sequence[str | os.PathLike] = (),
                analyses: Sequence[str | os.PathLike] = ()) -> Path:
    """Write the self-contained report index ``out`` and ``provenance.json`` beside it.

    Args:
        reports_dir: folder of rendered notebook HTML files (each linked, sorted by file name,
            titled by its first ``<h1>`` / ``<title>``, with its stage's wall time; ``out``
            itself is skipped).
        params_path: the run's ``params.yaml`` (shown verbatim, collapsed, and parsed into
            provenance.json).
        manifests: prepared-data ``manifest.json`` files (per-split sha256 and bytes).
        citation_path: ``CITATION.cff`` (parsed with YAML for the how-to-cite block).
        out: the index file to write.
        repo_dir: where to ask git for the commit and remote (default: the current directory).
        now: the timestamp to record (default: the current UTC time).
        claims_csv: the claims stage's table (Results at a glance; absent: a note says so).
        forest_png: the forest plot of the comparisons (embedded as a ``data:`` URI).
        resolved_params: ``results/params.json`` (the scale sentence).
        result_files: files whose sha256 is recorded (those that exist).
        analyses: the stages' ``analysis.json`` (parameter counts for the scale sentence).

    Returns:
        The path of the written index.
    """
    reports_dir, out = Path(reports_dir), Path(out)
    check(reports_dir.is_dir(), "reports_dir", str(reports_dir), "must be an existing folder")
    params_path = Path(params_path)
    params_text, params = _read_params(params_path)
    cff = read_citation(citation_path)
    data_rows = [row for m in manifests for row in read_manifest(m)]
    claims = _read_claims(Path(claims_csv) if claims_csv else None)
    forest = Path(forest_png).read_bytes() if forest_png and Path(forest_png).is_file() else None
    resolved = (read_json(resolved_params) if resolved_params and Path(resolved_params).is_file()
                else None)
    repo = Path(repo_dir) if repo_dir is not None else Path.cwd()
    git = git_info(repo)
    url = cff.get("repository-code") or cff.get("url") or git_remote_url(repo)
    out_dir = out.parent if str(out.parent) else Path(".")
    machine = machine_info()
    stamp = (now or _dt.datetime.now(_dt.UTC)).isoformat(timespec="seconds")
    commit = None if not git["commit"] else git["commit"] + (" (dirty)" if git["dirty"] else "")
    prov = {
        "generated_at": stamp,
        "git": git,
        "params": {"path": str(params_path), "sha256": _sha256_text(params_text),
                   "text": params_text, "content": params},
        "resolved_params": resolved,
        "scale": scale_sentence(resolved, machine,
                                _analysis_n_params([Path(a) for a in analyses])),
        "data": data_rows,
        "results": [{"file": str(f), "sha256": sha256_file(f), "bytes": Path(f).stat().st_size}
                    for f in result_files if Path(f).is_file()],
        "versions": package_versions(),
        "machine": machine,
        "reports": _report_rows(list_reports(reports_dir, exclude=[out]), out_dir),
        "claims": None if claims is None else json.loads(claims.to_json(orient="records")),
        "citation": _citation_block(cff, url, commit),
    }
    atomic_write_json(out_dir / PROVENANCE, _jsonable(prov))
    atomic_write_text(out, render_index(prov, claims, forest))
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
    """The ``report`` stage: ``reports/index.html`` with the results at a glance, every rendered
    notebook, the provenance of the active profile's prepared data and results, and how to
    cite."""
    from lmrepro.pipeline.params import load_params

    params = load_params(params_file, profile)
    manifests = [Path(params.data.prepared_dir) / name / "manifest.json"
                 for name in params.data.use]
    return build_index(reports_dir, params_file, manifests, "CITATION.cff",
                       out=Path(reports_dir) / "index.html", claims_csv=CLAIMS_CSV,
                       forest_png=FOREST_PNG, resolved_params=RESOLVED_PARAMS,
                       result_files=result_files(), analyses=analyses())
