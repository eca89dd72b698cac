"""The pipeline for real: notebooks executed by papermill, the CLI, and `dvc repro` (smoke profile).

These run in a throw-away copy of the repository so the working tree is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "embedded" / "shakespeare.txt"
BIN = Path(sys.executable).parent


def copy_project(dest: Path, profile: str = "smoke") -> Path:
    """A copy of the tracked sources plus the installed embedded corpus, profile set."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    assert CORPUS.exists(), "run scripts/setup.sh first: it installs the embedded corpus"
    (dest / "data" / "embedded").mkdir(parents=True, exist_ok=True)
    shutil.copy2(CORPUS, dest / "data" / "embedded" / "shakespeare.txt")
    raw = yaml.safe_load((dest / "params.yaml").read_text())
    raw["profile"] = profile
    (dest / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return dest


def run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_rejects_bad_params_without_creating_outputs(tmp_path):
    proj = copy_project(tmp_path)
    raw = yaml.safe_load((proj / "params.yaml").read_text())
    raw["train"]["steps"] = -3
    (proj / "bad.yaml").write_text(yaml.safe_dump(raw))
    proc = run([str(BIN / "lmrepro"), "train", "--params", "bad.yaml"], proj)
    assert proc.returncode == 2
    assert "train.steps = -3" in proc.stderr and "greater than or equal to 1" in proc.stderr
    assert not (proj / "results").exists()


@pytest.mark.slow
def test_notebooks_execute_with_papermill_and_render_html(tmp_path):
    from lmrepro.notebook import run_notebook

    proj = copy_project(tmp_path)
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        for name in ("01_fetch", "02_prepare", "03_train_baseline"):
            html = run_notebook(proj / "notebooks" / f"{name}.ipynb", proj / "reports", cwd=proj)
            assert html.exists() and "<html" in html.read_text()[:2000].lower()
    finally:
        os.chdir(cwd)
    metrics = json.loads((proj / "results" / "baseline" / "metrics.json").read_text())
    assert metrics["shakespeare/backprop"]["final_bpb"] < 8.0
    executed = json.loads((proj / "reports" / "03_train_baseline.ipynb").read_text())
    injected = [c for c in executed["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert not injected or "profile" in "".join(injected[0]["source"])
    # the notebook sources in the repo stay without outputs
    source = json.loads((ROOT / "notebooks" / "03_train_baseline.ipynb").read_text())
    assert all(not c.get("outputs") for c in source["cells"] if c["cell_type"] == "code")


@pytest.mark.slow
def test_dvc_repro_runs_the_pipeline_and_a_second_repro_does_nothing(tmp_path):
    proj = copy_project(tmp_path)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=proj, check=True, capture_output=True)
    dvc = str(BIN / "dvc")
    first = run([dvc, "repro"], proj, timeout=1500)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (proj / "reports" / "index.html").exists()
    metrics = run([dvc, "metrics", "show", "--json"], proj)
    assert metrics.returncode == 0 and "final_bpb" in metrics.stdout
    lock = (proj / "dvc.lock").read_text()
    second = run([dvc, "repro"], proj)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Running stage" not in second.stdout, second.stdout
    assert (proj / "dvc.lock").read_text() == lock
    status = run([dvc, "status"], proj)
    assert "up to date" in status.stdout.lower(), status.stdout
