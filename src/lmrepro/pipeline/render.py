"""An executed notebook as the HTML report a reader cites.

:func:`render_report` turns an executed notebook into one self-contained HTML file:

* figures inline (PNG outputs are embedded as ``data:`` URIs by nbconvert), and no external
  script (the lab template's require.js, MathJax and Mermaid loaders are left out: the reports
  use none of them), so a saved file opened offline shows everything;
* code input hidden, in every report: the parameter cells (``parameters``, papermill's
  ``injected-parameters``) and cells tagged ``remove-cell`` are dropped, every other code cell
  shows its output only (nbconvert's ``exclude_input``), and a code cell without output
  disappears; the code stays in the executed ``.ipynb`` beside the report;
* a real ``<title>`` (the notebook's first heading) and a header with the links to the index and
  to the neighbouring reports, the profile, the parameter file, the git commit, the time it was
  made and how long the notebook ran (:class:`ReportHeader`);
* tables styled to wrap and fit the page (:mod:`lmrepro.pipeline.tables`).
"""

from __future__ import annotations

import copy
import datetime as _dt
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REMOVE_CELL_TAGS = frozenset({"parameters", "injected-parameters", "remove-cell"})

# extends nbconvert's "lab" template: no external scripts, our CSS, our header
_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block extra_css %}<style>{{ resources.lmrepro_css }}</style>{% endblock extra_css %}
{%- block body_header -%}{{ super() }}{{ resources.lmrepro_header }}{%- endblock body_header -%}
{% block data_png scoped %}
{%- set alt = output | get_metadata('alt', 'image/png') -%}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}"
alt="{{ (alt or 'figure') | escape_html }}">
</div>
{%- endblock data_png %}
"""

CSS = """
main{max-width:1150px;margin:0 auto}
.lmrepro-header{max-width:1150px;margin:0 auto;padding:.6em 1em;border-bottom:1px solid #ddd;
font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:13px;
color:#333;background:#fafafa}
.lmrepro-header nav{margin-bottom:.3em}.lmrepro-header nav a{margin-right:1.2em}
.lmrepro-header code{font-size:12px}.lmrepro-header .dirty{color:#b00020;font-weight:bold}
.lmrepro-table{max-width:100%;overflow-x:auto;margin:.4em 0}
.jp-RenderedHTMLCommon .lmrepro-table table,.lmrepro-table table{border-collapse:collapse;
font-size:12.5px;table-layout:auto;width:auto;max-width:100%;margin-left:0}
.lmrepro-table caption{text-align:left;font-weight:600;padding:.2em 0}
.jp-RenderedHTMLCommon .lmrepro-table table th,.jp-RenderedHTMLCommon .lmrepro-table table td{
border:1px solid #ddd;padding:.25em .5em;vertical-align:top;white-space:normal;
overflow-wrap:break-word;word-break:normal;max-width:30em;text-align:left}
.jp-RenderedHTMLCommon .lmrepro-table table td.long{overflow-wrap:anywhere;
font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:11.5px}
.jp-RenderedHTMLCommon .lmrepro-table table th{background:#f3f3f3}
.jp-RenderedHTMLCommon .lmrepro-table table td.num{text-align:right;white-space:nowrap}
.lmrepro-table td.verdict-reproduced{background:#e3f4e6}
.lmrepro-table td.verdict-consistent-with-the-authors-logs{background:#e6eefb}
.lmrepro-table td.verdict-not-measured-in-the-authors-logs{background:#f3f3f3}
.lmrepro-table td.verdict-not-reproduced{background:#fbe4e4}
.lmrepro-table td.verdict-inconclusive{background:#fff4d6}
.jp-RenderedImage img{max-width:100%;height:auto}
.jp-OutputArea-output pre{white-space:pre-wrap;overflow-wrap:break-word}
""".strip()


@dataclass(frozen=True)
class Link:
    """A link of the header: where (relative to the report) and its text."""

    href: str
    text: str


@dataclass(frozen=True)
class ReportHeader:
    """What the header of a report says."""

    title: str
    profile: str
    params_file: str
    git: dict[str, Any]
    generated_at: str
    duration_s: float | None
    index: Link | None
    previous: Link | None
    next: Link | None
    parameters: dict[str, Any]


_H1 = re.compile(r"^\s*#\s+(.+?)\s*#*\s*$", re.MULTILINE)


def notebook_title(nb: Any, default: str = "") -> str:
    """The text of the first ``# heading`` of the notebook's first markdown cell that has one."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            if m := _H1.search(source):
                return m.group(1).strip()
    return default


def neighbours(notebook: Path) -> tuple[Path | None, Path | None]:
    """The pipeline notebooks (``NN_*.ipynb`` beside ``notebook``, by name) before and after."""
    names = sorted(p for p in notebook.parent.glob("[0-9][0-9]_*.ipynb") if p.is_file())
    if notebook.resolve() not in [p.resolve() for p in names]:
        return None, None
    i = [p.resolve() for p in names].index(notebook.resolve())
    return (names[i - 1] if i > 0 else None), (names[i + 1] if i + 1 < len(names) else None)


def duration_text(seconds: float | None) -> str:
    """``42 s``, ``3 min 12 s`` or ``1 h 02 min``."""
    if seconds is None:
        return "unknown"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def header_html(h: ReportHeader) -> str:
    """The header block of a report (escaped)."""
    e = html.escape
    links = [f'<a href="{e(link.href)}">{e(label)}{e(link.text)}</a>'
             for link, label in ((h.index, "⌂ "), (h.previous, "← "), (h.next, "→ ")) if link]
    git = h.git
    if git.get("available"):
        state = {True: ' <span class="dirty">(dirty: tracked files differ)</span>',
                 False: " (clean)", None: ""}[git.get("dirty")]
        commit = f"commit <code>{e(str(git['commit'])[:12])}</code>{state}"
    else:
        commit = f"commit unknown ({e(str(git.get('note', '')))})"
    extra = [f"{e(str(k))} = <code>{e(repr(v))}</code>" for k, v in h.parameters.items()
             if k not in ("params_file", "profile")]
    facts = [f"profile <b>{e(h.profile)}</b> of <code>{e(h.params_file)}</code>", commit,
             f"made {e(h.generated_at)}", f"notebook ran {e(duration_text(h.duration_s))}",
             *extra]
    return (f'<header class="lmrepro-header"><nav>{"".join(links)}</nav>'
            f'<div>lmrepro report · {" · ".join(facts)}</div></header>')


def prepare_for_report(nb: Any) -> Any:
    """A copy of ``nb`` with the parameter cells dropped and code input hidden (see the module
    docstring); the executed notebook itself is not changed."""
    out = copy.deepcopy(nb)
    cells = []
    for cell in out.cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code":
            if tags & REMOVE_CELL_TAGS or not cell.get("outputs"):
                continue
            cell.metadata["transient"] = {"remove_source": True}
        cells.append(cell)
    out.cells = cells
    return out


def render_report(nb: Any, header: ReportHeader) -> str:
    """The HTML report of an executed notebook (see the module docstring)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    shown = prepare_for_report(nb)
    shown.metadata["title"] = f"{header.title} · lmrepro ({header.profile})"
    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader(
        {"lmrepro_report.html.j2": _TEMPLATE})], template_file="lmrepro_report.html.j2",
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(shown, resources={
        "lmrepro_header": header_html(header), "lmrepro_css": CSS})
    return body


def utc_now() -> str:
    """The current UTC time, to the second, ISO 8601."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
