"""Execute a parameterized notebook with papermill and render it to HTML under ``reports/``.

Every pipeline stage is ``lmrepro notebook notebooks/NN_name.ipynb``: the executed copy goes to
``reports/NN_name.ipynb`` and its HTML rendering (figures inline, code input hidden, a header with
the commit, the profile and links to the index and the neighbouring reports:
:mod:`lmrepro.pipeline.render`) to ``reports/NN_name.html``. Both are written atomically: a failed
execution leaves the previous report in place and raises with papermill's message (the failing
cell's traceback). How long the notebook ran is papermill's ``metadata.papermill.duration`` of the
executed copy (the index reads it).

The kernel is told it renders a report (:data:`REPORT_ENV`): its first cell
(:func:`lmrepro.pipeline.session.start`) then sends logging, warnings and progress bars to the
terminal, not into the report. Figures use the inline backend (an inherited ``MPLBACKEND=Agg``
would turn every figure into a ``<Figure size ...>`` line).

The kernel talks to this process over Unix sockets in the run's private scratch directory
(:func:`kernel_transport`), not TCP ports on localhost, and is ended without the interrupt
jupyter_client sends first (:func:`kernel_manager_class`), its control task's end unlogged
(:class:`KernelControlTaskEnd`): a stage's log holds our lines and the notebook's, no kernel
warnings and no tracebacks of the kernel's shutdown.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any

from lmrepro.errors import check
from lmrepro.io import atomic_write_text
from lmrepro.lifetime import RUNNER_PID_ENV, scratch_dir

log = logging.getLogger(__name__)

#: set to "1" in the kernel's environment by :func:`run_notebook`
REPORT_ENV = "LMREPRO_REPORT"
#: run by the kernel before any cell (:func:`prepare_report_kernel`)
KERNEL_EXEC_LINES = ("--IPKernelApp.exec_lines=__import__('lmrepro.pipeline.notebook', "
                     "fromlist=['_']).prepare_report_kernel() and None")
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def _kernel_env() -> None:
    """Make the ``python3`` kernel the interpreter running us (the project's environment), with
    the inline figure backend, the report flag and our PID (for :data:`KERNEL_EXEC_LINES`)."""
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if not path.startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + path
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    os.environ[REPORT_ENV] = "1"
    os.environ[RUNNER_PID_ENV] = str(os.getpid())
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


class KernelControlTaskEnd(logging.Filter):
    """Drops asyncio's "Task was destroyed but it is pending!" for ipykernel's control task.

    ipykernel answers the shutdown request inside the task that dispatches control messages
    (``Kernel.dispatch_control``) and stops the control loop from there, so that task is still
    pending when the kernel exits; when the garbage collector reaches it first, asyncio logs it
    as an error into the stage's log. It is the kernel's normal end, not the notebook's; any
    other pending task is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("Task was destroyed but it is pending!")
                    and "Kernel.dispatch_control()" in text)


def prepare_report_kernel() -> int | None:
    """Run by a report's kernel before any cell (:data:`KERNEL_EXEC_LINES`): it dies the moment
    the runner does, whatever the notebook holds (:func:`lmrepro.lifetime.die_with_report_runner`;
    the PID watched, None outside a report), and the end of its control task stays out of the
    log (:class:`KernelControlTaskEnd`)."""
    from lmrepro.lifetime import die_with_report_runner

    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, KernelControlTaskEnd) for f in asyncio_log.filters):
        asyncio_log.addFilter(KernelControlTaskEnd())
    return die_with_report_runner()


#: the longest path of a Unix socket (``sun_path`` holds 108 bytes with the closing NUL)
SOCKET_PATH_MAX = 107


def kernel_transport(scratch: Path) -> dict[str, str]:
    """The kernel manager's settings for channels on Unix sockets ``scratch/kernel-N`` (the
    ``ipc`` transport): ``scratch`` is private to this user and removed with the run, so no port
    is raced for, no other user can connect or listen, and ipykernel has no unencrypted TCP to
    warn of. Empty (TCP, as jupyter's default) when the paths would be too long for a socket: a
    ``TMPDIR`` over about 80 characters deep."""
    base = str(scratch / "kernel")
    if len(os.fsencode(base)) + len("-99") > SOCKET_PATH_MAX:
        return {}
    return {"transport": "ipc", "ip": base}


@functools.cache
def kernel_manager_class() -> type:
    """nbclient's kernel manager (``AsyncKernelManager``), except that it ends the kernel
    without interrupting it first.

    jupyter_client sends SIGINT before its shutdown request. Papermill shuts down right after
    the reply to its closing ``kernel_info`` request, while the kernel may still be in that
    request's handler (on a loaded machine it often is): there SIGINT raises KeyboardInterrupt,
    which ipykernel logs ("KeyboardInterrupt caught in kernel") or, a few lines later, lets
    escape with a traceback through zmqstream's ``_log_error``, leaving asyncio tasks pending
    ("Task was destroyed but it is pending!"). The shutdown request alone ends a kernel that
    runs no cell; one that does not end gets SIGTERM then SIGKILL, as before. Interrupts other
    than at shutdown (nbclient's on a cell timeout) are unchanged."""
    from jupyter_client.manager import AsyncKernelManager

    class ReportKernelManager(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return ReportKernelManager


def _active_profile(params_file: str | Path, profile: str | None) -> str:
    """The profile a run used: the explicit one, else the environment's
    (:data:`lmrepro.paramfile.PROFILE_ENV`), else the ``profile`` key of the file (the order of
    :func:`lmrepro.paramfile.resolve_profile`)."""
    from lmrepro.paramfile import PROFILE_ENV

    if profile or os.environ.get(PROFILE_ENV):
        return str(profile or os.environ[PROFILE_ENV])
    import yaml

    try:
        raw = yaml.safe_load(Path(params_file).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return "unknown"
    return str(raw.get("profile", "default")) if isinstance(raw, dict) else "unknown"


def report_header(notebook: Path, nb: Any, parameters: dict[str, Any], cwd: Path) -> Any:
    """The :class:`~lmrepro.pipeline.render.ReportHeader` of an executed notebook."""
    import nbformat

    from lmrepro.pipeline.provenance import git_info
    from lmrepro.pipeline.render import Link, ReportHeader, neighbours, notebook_title, utc_now

    def link(path: Path | None) -> Link | None:
        if path is None:
            return None
        title = notebook_title(nbformat.read(path, as_version=4), path.stem)
        return Link(f"{path.stem}.html", f"{path.stem[:2]} {title}")

    before, after = neighbours(notebook)
    params_file = str(parameters.get("params_file") or "params.yaml")
    duration = nb.metadata.get("papermill", {}).get("duration")
    return ReportHeader(
        title=notebook_title(nb, notebook.stem),
        profile=_active_profile(cwd / params_file, parameters.get("profile")),
        params_file=params_file, git=git_info(cwd), generated_at=utc_now(),
        duration_s=None if duration is None else float(duration),
        index=Link("index.html", "index"), previous=link(before), next=link(after),
        parameters=dict(parameters))


#: the longest one cell may run: a published profile's training cell runs up to 120 minutes on a
#: quiet 2-core machine, and more beside other work (the reference profile's SCAPE sweep and
#: suite, 34 minutes quiet, passed 60 with tests running beside it); hangs are caught sooner by
#: the trainers' own timeouts (scape.timeout_s, rgc.timeout_s)
CELL_TIMEOUT_S = 4 * 3600


def run_notebook(notebook: str | Path, reports_dir: str | Path = "reports",
                 parameters: dict[str, Any] | None = None, cwd: str | Path | None = None,
                 timeout_s: int = CELL_TIMEOUT_S) -> Path:
    """Execute ``notebook`` with ``parameters``; return the path of the rendered HTML."""
    import nbformat
    import papermill
    from traitlets.config import Config

    from lmrepro.pipeline.render import render_report

    notebook = Path(notebook)
    check(notebook.suffix == ".ipynb" and notebook.exists(), "notebook", str(notebook),
          "must be an existing .ipynb file")
    reports_dir = Path(reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    _kernel_env()
    workdir = Path(cwd or Path.cwd())
    executed = reports_dir / notebook.name
    html = executed.with_suffix(".html")
    log.info("executing %s -> %s", notebook, html)
    # outside reports/, removed even after a SIGKILL (by the next run): docs/reliability.md
    with scratch_dir("notebook") as tmp:
        tmp_nb = Path(tmp) / notebook.name
        papermill.execute_notebook(
            str(notebook), str(tmp_nb), parameters=parameters or {}, kernel_name="python3",
            cwd=str(workdir), progress_bar=False, execution_timeout=timeout_s,
            log_output=False, extra_arguments=[KERNEL_EXEC_LINES],
            kernel_manager_class=kernel_manager_class(),
            config=Config({"KernelManager": kernel_transport(Path(tmp))}),
        )
        nb = nbformat.read(tmp_nb, as_version=4)
        body = render_report(nb, report_header(notebook, nb, parameters or {}, workdir))
        atomic_write_text(executed, nbformat.writes(nb))
        atomic_write_text(html, body)
    return html
