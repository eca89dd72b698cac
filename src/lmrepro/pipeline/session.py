"""The first code cell of every notebook: ``params = start(params_file, profile, wings=WINGS)``.

:func:`start` makes a notebook run the same way from ``notebooks/`` (as ``jupyter lab`` opens it),
from the project root (as the pipeline runs it) or from anywhere below the root:

* it finds the project root (the nearest folder at or above the working directory that holds
  ``params.yaml`` and ``dvc.yaml``) and makes it the working directory, so every relative path of
  the pipeline (``results/``, ``data/``, ``reports/``) means the same thing;
* it sends output where it belongs: in a report rendered by the pipeline (the runner sets
  :data:`~lmrepro.pipeline.notebook.REPORT_ENV`), logging, warnings and progress bars go to the
  terminal that runs the pipeline, not into the HTML (what the notebook *prints* and *displays*
  is the report); interactively they show in the notebook, ``lmrepro`` at INFO and everything
  else at WARNING (no matplotlib chatter);
* figures render inline: a :class:`matplotlib.figure.Figure` returned by a cell (the package's
  plots are built without pyplot) is shown as a PNG, and pyplot uses the inline backend;
* it installs the wings it is given (the pipeline's vocabulary: :mod:`lmrepro.pipeline.registry`);
* it reads and validates the parameter file (every profile) and returns the active profile's
  :class:`~lmrepro.pipeline.params.Params`.

Re-running a training cell does not redo finished training: every stage reads back the runs whose
``summary.json`` exists and resumes the others from their checkpoints.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmrepro.errors import ParameterError
from lmrepro.pipeline.notebook import INLINE_BACKEND, REPORT_ENV
from lmrepro.pipeline.params import Params, load_params
from lmrepro.pipeline.registry import Wing, install

ROOT_MARKERS = ("params.yaml", "dvc.yaml")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIGURE_DPI = 110


def find_project_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: the working directory) holding every
    file of :data:`ROOT_MARKERS`."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if all((folder / marker).is_file() for marker in ROOT_MARKERS):
            return folder
    markers = " and ".join(ROOT_MARKERS)
    raise ParameterError("working directory", str(here),
                         f"must be inside the project (a folder holding {markers}, e.g. the "
                         "repository root or its notebooks/ folder)")


def resolve_params_file(params_file: str | os.PathLike | None, root: Path,
                        cwd: Path | None = None) -> Path:
    """The parameter file: ``root/params.yaml`` by default; a relative path is taken from the
    working directory when it exists there, else from the project root."""
    if params_file is None:
        return root / "params.yaml"
    path = Path(params_file)
    if path.is_absolute():
        return path
    here = (cwd or Path.cwd()) / path
    return here if here.exists() else root / path


def in_report() -> bool:
    """Whether this kernel renders a pipeline report (the runner set :data:`REPORT_ENV`)."""
    return os.environ.get(REPORT_ENV) == "1"


def terminal_stream() -> Any:
    """A text stream to the terminal that started the kernel: ipykernel captures file
    descriptor 2 for the notebook and keeps the original as ``sys.stderr.fileno()``."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ or sys.stderr
    return open(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")


def configure_output(report: bool) -> None:
    """Logging, warnings and progress bars: to the terminal in a report, in the notebook
    otherwise; ``lmrepro`` loggers at INFO, the rest at WARNING."""
    if report:
        # tqdm, warnings and logging write to sys.stderr: in a report that is the terminal
        sys.stderr = terminal_stream()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("lmrepro").setLevel(logging.INFO)
    # tqdm.auto without ipywidgets warns once and falls back to text bars, which is what we want
    warnings.filterwarnings("ignore", message="IProgress not found")


def figure_alt(fig: Any) -> str:
    """A figure's alternative text: its titles (the figure's, then each axes')."""
    titles = [fig._suptitle.get_text()] if getattr(fig, "_suptitle", None) else []
    titles += [ax.get_title() for ax in fig.axes if ax.get_title()]
    return "; ".join(titles) or "figure"


def _figure_png(fig: Any) -> tuple[bytes, dict[str, str]]:
    """PNG bytes and metadata (the alternative text the report's ``<img>`` carries)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIGURE_DPI, bbox_inches="tight",
                metadata={"Software": None})
    return buf.getvalue(), {"alt": figure_alt(fig)}


def configure_figures() -> None:
    """Figures inline: the PNG formatter for :class:`~matplotlib.figure.Figure` objects and the
    inline backend for pyplot (only inside an IPython kernel)."""
    import matplotlib

    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    from matplotlib.figure import Figure

    matplotlib.use(INLINE_BACKEND)
    shell.display_formatter.formatters["image/png"].for_type(Figure, _figure_png)


def start(params_file: str | os.PathLike | None = None, profile: str | None = None, *,
          wings: Sequence[Wing]) -> Params:
    """Set up a notebook (see the module docstring), install ``wings``
    (:data:`lmrepro.wings.WINGS`, :func:`lmrepro.pipeline.registry.install`) and return the
    validated parameters of ``profile`` (default: the file's ``profile``) of ``params_file``
    (default: the project's ``params.yaml``)."""
    install(wings)
    cwd = Path.cwd()
    root = find_project_root(cwd)
    path = resolve_params_file(params_file, root, cwd)
    os.chdir(root)
    report = in_report()
    configure_output(report)
    configure_figures()
    import pandas as pd
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    pd.set_option("display.max_colwidth", None)
    params = load_params(path, profile)
    if not report:   # a report's header says this
        print(f"lmrepro: profile {params.profile!r} of {path}; working directory {root}")
    return params
