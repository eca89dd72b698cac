"""The page ``dvc plots show`` renders into, without the network.

DVC's own page loads vega, vega-lite and vega-embed from a CDN: offline its data plots come out
blank. Set-up (``scripts/setup.sh``) runs ``python -m lmrepro.pipeline.dvcplots``, which writes
:data:`PAGE` (``.dvc/plots.html``, not tracked) with the three libraries inlined from an
installed package (``vl-convert-python``: :func:`vl_convert.javascript_bundle`); ``.dvc/config``
names it (``plots.html_template``), so ``dvc plots show`` and ``dvc plots diff`` write a
``dvc_plots/index.html`` that renders anywhere, offline included.

The data plots themselves (``loss_curve.csv``, ``bytes_per_step.csv``: one row per run, seed and
step) are drawn by the templates ``.dvc/plots/runs.json`` and ``runs-log.json``: one line per
run and seed, coloured by run, dashed by revision (so ``dvc plots diff A B`` compares two
experiments line by line).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lmrepro.io import atomic_write_text

#: the page, relative to the project root (``plots.html_template`` in ``.dvc/config`` is
#: relative to ``.dvc/``)
PAGE = Path(".dvc") / "plots.html"
#: where DVC puts the rendered plots (dvc_render.html.HTML)
PLOTS_PLACEHOLDER = "{plot_divs}"


def page_html(bundle: str) -> str:
    """The page around DVC's plots (its ``{plot_divs}`` placeholder) with ``bundle`` (the
    JavaScript that defines ``vegaEmbed``, ``vega`` and ``vegaLite`` on ``window``) inlined
    before them: DVC's divs call ``vegaEmbed`` as the page is read. No ``{scripts}``
    placeholder: DVC would put its CDN ``<script>`` tags there."""
    safe = bundle.replace("</script", "<\\/script")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{{refresh_tag}}
<title>lmrepro: DVC plots</title>
<script>
(function () {{
{safe}
}})();
</script>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1em}}
table{{border-spacing:15px}}
</style>
</head>
<body>
{PLOTS_PLACEHOLDER}
</body>
</html>
"""


def vega_bundle() -> str:
    """vega, vega-lite and vega-embed in one script, from the installed ``vl-convert-python``."""
    import vl_convert

    return vl_convert.javascript_bundle()


def write_page(root: str | os.PathLike = ".") -> Path:
    """Write :data:`PAGE` under ``root``; returns its path."""
    path = Path(root) / PAGE
    atomic_write_text(path, page_html(vega_bundle()))
    return path


if __name__ == "__main__":
    print(f"dvc plots: wrote {write_page(sys.argv[1] if len(sys.argv) > 1 else '.')}")
