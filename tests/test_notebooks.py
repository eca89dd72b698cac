"""The notebooks as a reader and a user meet them: the shared first cells, figures that render in
the HTML report (even with ``MPLBACKEND=Agg`` inherited), no log or progress noise in it, a real
title and header, and the analysis notebooks run as opened from ``notebooks/``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _runs import make_run

from lmrepro.errors import ParameterError
from lmrepro.pipeline import render as R
from lmrepro.pipeline import session as S

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHARED_PARAMS = ("params_file = None  # default: params.yaml at the project root\n"
                 "profile = None  # default: the profile named in the parameter file")
SHARED_SETUP = ("from lmrepro.pipeline.session import start\nfrom lmrepro.wings import WINGS\n\n"
                "params = start(params_file, profile, wings=WINGS)")
# code that draws: a cell holding it must be tagged "figure" (so the tests below check its image)
DRAWS = re.compile(r"figures\[|figures\.get|plot_\w+\(|Figure\(|\.subplots\(")
PNG = 'src="data:image/png;base64,'


def source(cell: dict) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_starts_with_the_shared_cells(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    assert cells[0]["cell_type"] == "markdown" and source(cells[0]).startswith("# ")
    assert tags(cells[1]) == {"parameters"} and source(cells[1]) == SHARED_PARAMS
    assert source(cells[2]) == SHARED_SETUP
    # one parameter cell, one setup call, stored without outputs
    assert sum("parameters" in tags(c) for c in cells) == 1
    assert sum("start(params_file" in source(c) for c in cells) == 1
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in cells if c["cell_type"] == "code")
    for cell in cells:
        if cell["cell_type"] == "code" and DRAWS.search(source(cell)):
            assert "figure" in tags(cell), f"{path.name}: a plot cell is not tagged 'figure'"


def test_the_project_root_is_found_from_below(tmp_path: Path) -> None:
    for marker in S.ROOT_MARKERS:
        (tmp_path / marker).write_text("x: 1\n")
    (tmp_path / "notebooks" / "deep").mkdir(parents=True)
    assert S.find_project_root(tmp_path / "notebooks") == tmp_path.resolve()
    assert S.find_project_root(tmp_path / "notebooks" / "deep") == tmp_path.resolve()
    (tmp_path / "alone").mkdir()
    (tmp_path / "dvc.yaml").unlink()
    with pytest.raises(ParameterError) as info:
        S.find_project_root(tmp_path / "alone")
    assert info.value.name == "working directory" and "params.yaml and dvc.yaml" in str(info.value)
    root = tmp_path.resolve()
    assert S.resolve_params_file(None, root) == root / "params.yaml"
    (tmp_path / "notebooks" / "mine.yaml").write_text("x: 1\n")
    assert (S.resolve_params_file("mine.yaml", root, tmp_path / "notebooks")
            == tmp_path / "notebooks" / "mine.yaml")             # found where the user is
    assert S.resolve_params_file("params.yaml", root, tmp_path / "alone") == root / "params.yaml"


def test_neighbours_titles_and_durations(tmp_path: Path) -> None:
    for name in ("01_a.ipynb", "02_b.ipynb", "03_c.ipynb", "notes.ipynb"):
        (tmp_path / name).write_text("{}")
    assert R.neighbours(tmp_path / "02_b.ipynb") == (tmp_path / "01_a.ipynb",
                                                      tmp_path / "03_c.ipynb")
    assert R.neighbours(tmp_path / "01_a.ipynb") == (None, tmp_path / "02_b.ipynb")
    assert R.neighbours(tmp_path / "notes.ipynb") == (None, None)
    nb = {"cells": [{"cell_type": "code", "source": "# not a title"},
                    {"cell_type": "markdown", "source": ["Intro\n", "# The title #\n"]}]}
    assert R.notebook_title(nb) == "The title"
    assert R.notebook_title({"cells": []}, "fallback") == "fallback"
    assert [R.duration_text(s) for s in (None, 42.4, 192, 3725)] == [
        "unknown", "42 s", "3 min 12 s", "1 h 02 min"]


def project(tmp_path: Path, profile: str = "smoke") -> Path:
    """The repository's notebooks, params.yaml, dvc.yaml and CITATION.cff in a fresh git
    repository (the reports ask git for the commit)."""
    proj = tmp_path / "proj"
    (proj / "notebooks").mkdir(parents=True)
    for name in ("params.yaml", "dvc.yaml", "CITATION.cff"):
        shutil.copy(ROOT / name, proj / name)
    for nb in NOTEBOOKS:
        shutil.copy(nb, proj / "notebooks" / nb.name)
    raw = yaml.safe_load((proj / "params.yaml").read_text())
    raw["profile"] = profile
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c",
                 "commit.gpgsign=false", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=proj, env=env, check=True, capture_output=True)
    return proj


def kernel_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1", **extra)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


DEMO = {
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# Demo report\n\nA test."},
        {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "execution_count": None,
         "outputs": [], "source": SHARED_PARAMS},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": SHARED_SETUP},
        {"cell_type": "code", "metadata": {}, "execution_count": None,
         "outputs": [], "source": (
             # the markers are built at run time so that the code shown is not what is searched
             "import logging, warnings\nfrom tqdm.auto import tqdm\n"
             "logging.getLogger('lmrepro.demo').info('LOG' + 'NOISE')\n"
             "logging.getLogger('matplotlib').info('ROOT' + 'NOISE')\n"
             "warnings.warn('WARN' + 'NOISE')\n"
             "for _ in tqdm(range(3), desc='BAR' + 'NOISE'):\n    pass\n"
             "print('PRINTED', params.profile)")},
        {"cell_type": "code", "metadata": {"tags": ["figure"]}, "execution_count": None,
         "outputs": [], "source": (
             "from matplotlib.figure import Figure\nfig = Figure()\nax = fig.subplots()\n"
             "ax.plot([0, 1], [1, 0])\nax.set_title('Demo line')\nfig  # HIDDENCODE")},
        {"cell_type": "code", "metadata": {"tags": ["figure"]}, "execution_count": None,
         "outputs": [], "source": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);"},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": "x = 1  # NOOUTPUT"},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                "name": "python3"}, "language_info": {"name": "python"}},
    "nbformat": 4, "nbformat_minor": 5}


@pytest.mark.slow
def test_a_report_shows_its_figures_and_no_noise(tmp_path: Path) -> None:
    proj = project(tmp_path)
    demo = proj / "notebooks" / "02_zdemo.ipynb"       # between 02_prepare and 03_train
    for i, cell in enumerate(DEMO["cells"]):
        cell["id"] = f"c{i}"
    demo.write_text(json.dumps(DEMO))
    # the cause: an inherited Agg backend turned every figure into "<Figure size ...>"
    proc = subprocess.run([sys.executable, "-m", "lmrepro", "notebook", str(demo)], cwd=proj,
                          env=kernel_env(MPLBACKEND="Agg"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (proj / "reports" / "02_zdemo.html").read_text()
    assert page.count(PNG) == 2 and "&lt;Figure size" not in page
    assert 'alt="Demo line"' in page and 'alt="figure"' in page      # titled, untitled
    assert "PRINTED smoke" in page
    # logging, warnings and progress bars went to the terminal, not into the report
    for noise in ("LOGNOISE", "ROOTNOISE", "WARNNOISE", "BARNOISE", "it/s", "IProgress"):
        assert noise not in page, noise
    assert "LOGNOISE" in proc.stderr and "BARNOISE" in proc.stderr and "WARNNOISE" in proc.stderr
    # ... and nothing of the kernel's own: no warning of unencrypted TCP (it has Unix sockets),
    # no traceback or pending task of its shutdown
    for noise in ("[IPKernelApp]", "Traceback", "Task was destroyed"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    # code input hidden in every cell; parameter cells gone; empty cells gone
    assert "HIDDENCODE" not in page and "NOOUTPUT" not in page
    assert "BARNOISE" not in page and "params_file" not in page.split("<main>")[1]
    main = page.split("<main>")[1]
    assert "warnings" not in main and "import" not in main and "hl-ipython3" not in main
    # a real title, the header, links to the index and the neighbours; nothing external
    assert "<title>Demo report · lmrepro (smoke)</title>" in page
    head = page.split('<header class="lmrepro-header">')[1].split("</header>")[0]
    assert 'href="index.html"' in head and 'href="02_prepare.html"' in head
    assert 'href="03_train_baseline.html"' in head and "02 Prepare byte-level splits" in head
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=proj, capture_output=True,
                            text=True).stdout.strip()
    assert commit[:12] in head and "profile <b>smoke</b>" in head and "notebook ran" in head
    assert not re.search(r"""(src|href)=["']https?://""", page)
    executed = json.loads((proj / "reports" / "02_zdemo.ipynb").read_text())
    assert executed["metadata"]["papermill"]["duration"] > 0
    # the executed notebook keeps the code
    assert any("HIDDENCODE" in source(c) for c in executed["cells"])


def test_the_kernel_talks_over_private_unix_sockets(tmp_path: Path) -> None:
    """The kernel's channels are Unix sockets in the run's scratch directory; where those paths
    would not fit a socket address, TCP (jupyter's default)."""
    from lmrepro.pipeline.notebook import SOCKET_PATH_MAX, kernel_transport

    assert kernel_transport(tmp_path) == {"transport": "ipc", "ip": str(tmp_path / "kernel")}
    deep = tmp_path / ("d" * (SOCKET_PATH_MAX - len(str(tmp_path)) - len("/kernel")))
    assert kernel_transport(deep) == {}
    fits = tmp_path / ("d" * (SOCKET_PATH_MAX - len(str(tmp_path)) - len("/kernel-99") - 1))
    assert kernel_transport(fits)["transport"] == "ipc"


def write_runs(proj: Path) -> None:
    """Finished made-up runs of both suites for seeds 0 and 1, where the stages write them."""
    scape = proj / "results" / "scape" / "runs" / "shakespeare"
    rgc = proj / "results" / "rgc" / "runs" / "shakespeare"
    for seed in (0, 1):
        for name, method, extra in [("adamw", "adamw", {}), ("adams", "adams", {}),
                                    ("scape90", "scape", {"details": {"sparsity": 0.9}}),
                                    ("topk99", "topk", {"details": {"sparsity": 0.99}})]:
            make_run(scape / f"seed{seed}", name, method, seed=seed, processes=2, threads=2,
                     rel=0.05 * (method == "topk"), **extra,
                     bytes_per_step={"grad_values": 10.0, "param_values": 0.0, "mask": 0.0,
                                     "total": 10.0})
        idle = {"rss": 300 * 2**20, "pss": 120 * 2**20, "uss": 100 * 2**20}
        make_run(rgc / f"seed{seed}", "backprop", "backprop", details={"executor": "backprop"},
                 seed=seed, peak_pss_bytes=800 * 2**20, idle_torch_process=idle)
        make_run(rgc / f"seed{seed}", "rgc-async", "rgc", details={"executor": "async"},
                 seed=seed, rel=0.004, processes=2, peak_pss_bytes=1100 * 2**20,
idle_torch_process=idle)


@pytest.mark.slow
def test_analysis_notebooks_run_as_opened_from_notebooks(tmp_path: Path) -> None:
    """jupyter lab's kernel starts in notebooks/: the notebooks find the project root, read the
    runs and draw their figures (no parameters injected: the defaults of the notebook)."""
    import nbformat
    import papermill

    proj = project(tmp_path)
    write_runs(proj)
    for name in ("06_analysis_scape", "07_analysis_rgc", "08_claims"):
        out = tmp_path / f"{name}.ipynb"
        papermill.execute_notebook(str(proj / "notebooks" / f"{name}.ipynb"), str(out),
                                   cwd=str(proj / "notebooks"), kernel_name="python3",
                                   progress_bar=False)
        nb = nbformat.read(out, as_version=4)
        figures = [c for c in nb.cells if "figure" in c.metadata.get("tags", [])]
        drawn = [c for c in figures if any("image/png" in o.get("data", {}) for o in c.outputs)]
        assert drawn, name
        for cell in figures:    # a figure with nothing to draw in this profile says so instead
            if cell not in drawn:
                said = "".join("".join(o.get("text", "")) for o in cell.outputs)
                assert "in this profile" in said, (name, cell.source)
    # the products landed at the project root, not under notebooks/
    assert (proj / "results" / "analysis" / "claims.csv").is_file()
    assert not (proj / "notebooks" / "results").exists()
    claims = (proj / "results" / "analysis" / "claims.csv").read_text()
    assert "one training seed" not in claims and "2 training seeds" in claims


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_notebook_repeats_a_cell(path: Path) -> None:
    """A merge once left the loss-curve cell twice in 06 and 07 (each report drew it twice) and
    repeated cell ids: every code cell and every id appears once."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]).strip() for c in cells if c["cell_type"] == "code"]
    code = [s for s in code if s]
    assert len(code) == len(set(code)), [s for s in code if code.count(s) > 1]
    ids = [c.get("id") for c in cells]
    assert len(ids) == len(set(ids))


def test_a_report_kernel_drops_only_its_control_tasks_pending_end(caplog, monkeypatch):
    """asyncio logs a task destroyed while pending; a report's kernel drops that record for
    ipykernel's control dispatcher (which answers the shutdown request from inside itself) and
    keeps it for any other task."""
    import asyncio
    import gc
    import logging

    from lmrepro.lifetime import RUNNER_PID_ENV
    from lmrepro.pipeline.notebook import KernelControlTaskEnd, prepare_report_kernel

    class Kernel:
        async def dispatch_control(self) -> None:
            await asyncio.sleep(3600)

    async def some_other_task() -> None:
        await asyncio.sleep(3600)

    monkeypatch.delenv(RUNNER_PID_ENV, raising=False)
    asyncio_log = logging.getLogger("asyncio")
    try:
        assert prepare_report_kernel() is None and prepare_report_kernel() is None
        assert sum(isinstance(f, KernelControlTaskEnd) for f in asyncio_log.filters) == 1
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            loop = asyncio.new_event_loop()
            tasks = [loop.create_task(Kernel().dispatch_control()),
                     loop.create_task(some_other_task())]
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()
            del tasks
            gc.collect()
        pending = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("Task was destroyed but it is pending!")]
        assert len(pending) == 1 and "some_other_task()" in pending[0], pending
    finally:
        for f in [f for f in asyncio_log.filters if isinstance(f, KernelControlTaskEnd)]:
            asyncio_log.removeFilter(f)
