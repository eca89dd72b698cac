"""Execute a parameterized notebook with papermill and render it to HTML under ``reports/``.

Every pipeline stage is ``lmrepro notebook notebooks/NN_name.ipynb``: the executed copy goes to
``reports/NN_name.ipynb`` and its HTML rendering (code, tables, plots) to ``reports/NN_name.html``.
Both are written atomically: a failed execution leaves the previous report in place and raises with
papermill's message (the failing cell's traceback).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from lmrepro.errors import check
from lmrepro.io import atomic_write_text
from lmrepro.lifetime import scratch_dir

log = logging.getLogger(__name__)


def _kernel_env() -> None:
    """Make the ``python3`` kernel the interpreter running us (the project's environment)."""
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if not path.startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + path
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def run_notebook(notebook: str | Path, reports_dir: str | Path = "reports",
                 parameters: dict[str, Any] | None = None, cwd: str | Path | None = None,
                 timeout_s: int = 3600) -> Path:
    """Execute ``notebook`` with ``parameters``; return the path of the rendered HTML."""
    import nbformat
    import papermill
    from nbconvert import HTMLExporter

    notebook = Path(notebook)
    check(notebook.suffix == ".ipynb" and notebook.exists(), "notebook", str(notebook),
          "must be an existing .ipynb file")
    reports_dir = Path(reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    _kernel_env()
    executed = reports_dir / notebook.name
    html = executed.with_suffix(".html")
    log.info("executing %s -> %s", notebook, html)
    # outside reports/, removed even after a SIGKILL (by the next run): docs/reliability.md
    with scratch_dir("notebook") as tmp:
        tmp_nb = Path(tmp) / notebook.name
        papermill.execute_notebook(
            str(notebook), str(tmp_nb), parameters=parameters or {}, kernel_name="python3",
            cwd=str(cwd or Path.cwd()), progress_bar=False, execution_timeout=timeout_s,
            log_output=False,
        )
        nb = nbformat.read(tmp_nb, as_version=4)
        body, _ = HTMLExporter().from_notebook_node(nb)
        atomic_write_text(executed, nbformat.writes(nb))
        atomic_write_text(html, body)
    return html
