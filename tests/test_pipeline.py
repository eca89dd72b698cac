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
    raw["profiles"]["smoke"]["train"]["steps"] = -3
    (proj / "bad.yaml").write_text(yaml.safe_dump(raw))
    for command in (["train"], ["fetch"], ["prepare"], ["report"]):
        proc = run([str(BIN / "lmrepro"), *command, "--params", "bad.yaml"], proj)
        assert proc.returncode == 2, (command, proc.stderr)
        assert "train.steps = -3" in proc.stderr, (command, proc.stderr)
        assert "greater than or equal to 1" in proc.stderr
    proc = run([str(BIN / "lmrepro"), "notebook", "notebooks/03_train_baseline.ipynb",
                "--params", "bad.yaml"], proj)
    assert proc.returncode != 0 and "train.steps = -3" in proc.stdout + proc.stderr
    assert not (proj / "results").exists() and not (proj / "data" / "prepared").exists()
    assert not (proj / "reports" / "03_train_baseline.html").exists()


@pytest.mark.slow
def test_dvc_repro_runs_the_pipeline_and_a_second_repro_does_nothing(tmp_path):
    proj = copy_project(tmp_path)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=proj, check=True, capture_output=True)
    dvc = str(BIN / "dvc")
    first = run([dvc, "repro"], proj, timeout=1500)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # every notebook was executed by papermill (parameters injected) and rendered to HTML
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        html = proj / "reports" / f"{nb.stem}.html"
        assert html.exists() and "<html" in html.read_text()[:2000].lower(), nb.name
        executed = json.loads((proj / "reports" / nb.name).read_text())
        assert any("injected-parameters" in c["metadata"].get("tags", [])
                   for c in executed["cells"]), nb.name
        # while the notebook sources in the repository stay without outputs
        source = json.loads(nb.read_text())
        assert all(not c.get("outputs") for c in source["cells"] if c["cell_type"] == "code")
        # every figure cell drew an image, and the report embeds it; no log or progress noise;
        # a real title
        # (or, where the profile has nothing to draw, says so in a line of its own)
        figures = [c for c in executed["cells"] if "figure" in c["metadata"].get("tags", [])]
        drawn = [c for c in figures if any("image/png" in o.get("data", {}) for o in c["outputs"])]
        for cell in figures:
            if cell not in drawn:
                said = "".join("".join(o.get("text", "")) for o in cell["outputs"])
                assert "in this profile" in said, (nb.name, "".join(cell["source"]))
        page = html.read_text()
        assert page.count('src="data:image/png;base64,') >= len(drawn), nb.name
        assert "<title>Notebook</title>" not in page and 'href="index.html"' in page
        for noise in ("it/s]", " INFO ", "TqdmWarning", "&lt;Figure size"):
            assert noise not in page, (nb.name, noise)
    index = (proj / "reports" / "index.html").read_text()
    assert all(f"{nb.stem}.html" in index for nb in (ROOT / "notebooks").glob("*.ipynb"))
    assert "Results at a glance" in index and index.count('src="data:image/png') == 1
    claims = (proj / "results" / "analysis" / "claims.csv").read_text()
    # one row per claim (and setting), each with its verdict
    n_rows = len(json.loads((proj / "reports" / "provenance.json").read_text())["claims"])
    claims_table = index.split("What the verdicts mean", 1)[0]     # the legend comes after
    assert n_rows >= 11 and claims_table.count('<td class="txt verdict-') == n_rows
    # every training suite ran once per seed of the profile (seeds 0 and 1)
    baseline = json.loads((proj / "results" / "baseline" / "metrics.json").read_text())
    assert sorted(baseline) == ["shakespeare/seed0/backprop", "shakespeare/seed1/backprop"]
    assert all(m["final_bpb"] < 8.0 for m in baseline.values())
    scape = json.loads((proj / "results" / "scape" / "metrics.json").read_text())
    assert {k.split("/")[1] for k in scape} == {"seed0", "seed1"}
    ni = json.loads((proj / "results" / "analysis" / "scape" / "noninferiority.json").read_text())
    assert any("scape" in k for k in ni) and all(v["seeds"] == 2 for v in ni.values())
    assert "2 training seeds" in claims
    # the headline metrics: one row per item, in a 120-column terminal
    metrics = run([dvc, "metrics", "show"], proj)
    assert metrics.returncode == 0 and "metrics/claims/scape-90-adamw.json" in metrics.stdout
    assert max(len(line) for line in metrics.stdout.splitlines()) <= 120, metrics.stdout
    assert "up %" in metrics.stdout and "not testable at this scale" in metrics.stdout
    plots = run([dvc, "plots", "show", "--json"], proj)
    assert plots.returncode == 0 and "loss_curve.csv" in plots.stdout, plots.stderr[-2000:]
    exps = run([dvc, "exp", "show", "--json"], proj)
    assert exps.returncode == 0 and "gap %" in exps.stdout, exps.stderr[-2000:]
    lock = (proj / "dvc.lock").read_text()
    second = run([dvc, "repro"], proj)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Running stage" not in second.stdout, second.stdout
    assert (proj / "dvc.lock").read_text() == lock
    status = run([dvc, "status"], proj)
    assert "up to date" in status.stdout.lower(), status.stdout


def test_running_a_training_stage_again_reads_the_finished_runs(tmp_path):
    """Re-running a notebook's training cell (or the stage) trains nothing that is finished."""
    from lmrepro.baseline.stage import run_suite
    from lmrepro.data.stage import prepare_all
    from lmrepro.pipeline.params import load_params

    proj = copy_project(tmp_path)
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        params = load_params("params.yaml")
        prepare_all(params.data)
        first = run_suite(params.train, params.model, params.seeds, params.data.prepared_dir,
                          progress=False)
        summary = proj / "results" / "baseline" / "runs" / "shakespeare" / "seed1" / "backprop"
        stamp = [(p.name, p.stat().st_mtime_ns) for p in sorted(summary.iterdir()) if p.is_file()]
        again = run_suite(params.train, params.model, params.seeds, params.data.prepared_dir,
                          progress=False)
    finally:
        os.chdir(cwd)
    assert sorted(first) == ["shakespeare/seed0/backprop", "shakespeare/seed1/backprop"]
    assert again == first
    assert [(p.name, p.stat().st_mtime_ns) for p in sorted(summary.iterdir())
            if p.is_file()] == stamp
