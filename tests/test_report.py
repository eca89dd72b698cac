"""Tests of the self-contained report index and provenance record."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lmrepro.errors import ParameterError
from lmrepro.pipeline import citation as CIT
from lmrepro.pipeline import provenance as PV
from lmrepro.pipeline import report as R

ROOT = Path(__file__).resolve().parents[1]
CITATION = ROOT / "CITATION.cff"
NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def git(cwd: Path, *args: str) -> str:
    """git in a throw-away repository of the test (never the project's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_CEILING_DIRECTORIES=str(cwd.parent))
    out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org",
                          "-c", "commit.gpgsign=false", *args], cwd=cwd, env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A small project folder: rendered reports, params.yaml, a data manifest, CITATION.cff."""
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "02_rgc.html").write_text(
        "<html><head><title>02_rgc</title></head><body>"
        "<h1 id='x'>RGC &amp; backprop<a class='anchor-link' href='#x'>¶</a></h1></body></html>",
        encoding="utf-8")
    (reports / "01_scape.html").write_text(
        "<html><head><title>SCAPE results</title></head><body><p>no heading</p></body></html>",
        encoding="utf-8")
    (reports / "03 <odd>.html").write_text("<html><body>plain</body></html>", encoding="utf-8")
    (tmp_path / "params.yaml").write_text("train:\n  steps: 200\n  lr: 0.001\nnote: a<b\n",
                                          encoding="utf-8")
    man = tmp_path / "data" / "prepared" / "shakespeare" / "manifest.json"
    man.parent.mkdir(parents=True)
    # the shape lmrepro.data.prepare writes
    man.write_text(json.dumps({
        "format": "lmrepro.prepared/1", "source": {"corpus": "shakespeare"},
        "files": {"train": {"file": "train.bin", "sha256": "a" * 64, "bytes": 900},
                  "val": {"file": "val.bin", "sha256": "b" * 64, "bytes": 50}},
        "raw_files": {"data/raw/shakespeare.txt": "e" * 64}}), encoding="utf-8")
    shutil.copy(CITATION, tmp_path / "CITATION.cff")
    return tmp_path


def build(project: Path, **kw) -> Path:
    return R.build_index(project / "reports", project / "params.yaml",
                         [project / "data/prepared/shakespeare/manifest.json"],
                         project / "CITATION.cff", out=project / "reports/index.html",
                         now=NOW, **kw)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_index_links_reports_commit_and_citation(project: Path) -> None:
    git(project, "init", "-q")
    git(project, "add", "params.yaml")
    git(project, "commit", "-q", "-m", "init")
    commit = git(project, "rev-parse", "HEAD")

    out = build(project, repo_dir=project)
    page = out.read_text(encoding="utf-8")

    # links, sorted by file name, titled (h1 before <title>, stem last), escaped
    a = page.index('href="01_scape.html"')
    b = page.index('href="02_rgc.html"')
    c = page.index('href="03%20%3Codd%3E.html"')
    assert a < b < c
    assert ">SCAPE results</a>" in page
    assert ">RGC &amp; backprop</a>" in page
    assert "03 &lt;odd&gt;</a>" in page and "<odd>" not in page
    assert 'href="index.html"' not in page

    # provenance
    assert commit in page and "(clean)" in page
    assert "steps: 200" in page and "note: a&lt;b" in page
    assert "a" * 64 in page and "900" in page
    assert "scipy" in page and "dvc" in page and "CPU count" in page
    assert "2026-12-03T12:00:00+00:00" in page

    # citation from CITATION.cff
    cff = yaml.safe_load(CITATION.read_text(encoding="utf-8"))
    assert "@software{lmrepro2026," in page
    assert "version = {0.1.0}" in page and "license = {MIT}" in page
    assert "lmrepro contributors (2026)" in page
    assert cff["title"] in page
    assert "arXiv:2607.01678" in page and "arXiv:2505.16363" in page
    assert "Readout-Gradient Consensus" in page

    # self-contained: inline CSS, no external assets
    assert "<style>" in page
    for bad in ("<script", "<link", "src=", "http://", "@import"):
        assert bad not in page

    prov = json.loads((project / "reports" / "provenance.json").read_text(encoding="utf-8"))
    assert prov["git"] == {"commit": commit, "dirty": False, "available": True, "note": ""}
    assert prov["params"]["content"] == {"train": {"steps": 200, "lr": 0.001}, "note": "a<b"}
    assert [(r["corpus"], r["split"], r["file"], r["sha256"], r["bytes"])
            for r in prov["data"]] == [
        ("shakespeare", "train", "train.bin", "a" * 64, 900),
        ("shakespeare", "val", "val.bin", "b" * 64, 50),
        ("shakespeare", "raw", "data/raw/shakespeare.txt", "e" * 64, None)]
    assert set(prov["versions"]) >= {"python", "torch", "numpy", "scipy", "pandas", "dvc"}
    assert prov["machine"]["cpu_count"] == os.cpu_count()
    assert prov["machine"]["memory_total_bytes"] > 0
    assert [r["file"] for r in prov["reports"]] == ["01_scape.html", "02_rgc.html",
                                                    "03 <odd>.html"]
    assert prov["citation"]["bibtex"].startswith("@software{")

    # dvc.lock and the headline metrics, which every dvc repro rewrites, leave a checkout clean
    (project / "dvc.lock").write_text("schema: '2.0'\n", encoding="utf-8")
    (project / "metrics" / "claims").mkdir(parents=True)
    (project / "metrics" / "claims" / "a.json").write_text('{"verdict": "reproduced"}')
    git(project, "add", "dvc.lock", "metrics")
    git(project, "commit", "-q", "-m", "lock")
    (project / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n", encoding="utf-8")
    (project / "metrics" / "claims" / "a.json").write_text('{"verdict": "not run"}')
    commit = git(project, "rev-parse", "HEAD")
    assert PV.git_info(project) == {"commit": commit, "dirty": False, "available": True,
                                   "note": ""}

    # a tracked change makes the checkout dirty; no temporary files are left behind
    (project / "params.yaml").write_text("train:\n  steps: 300\n", encoding="utf-8")
    page = build(project, repo_dir=project).read_text(encoding="utf-8")
    assert "(dirty" in page and commit in page
    assert 'href="index.html"' not in page and page.count("<li><a href=") == 3
    assert not [p for p in (project / "reports").iterdir() if p.name.endswith(".tmp")]


def test_outside_git_falls_back(project: Path) -> None:
    outside = project / "not_a_repo"
    outside.mkdir()
    env_ceiling = os.environ.get("GIT_CEILING_DIRECTORIES")
    os.environ["GIT_CEILING_DIRECTORIES"] = str(project)
    try:
        info = PV.git_info(outside)
        page = build(project, repo_dir=outside).read_text(encoding="utf-8")
    finally:
        if env_ceiling is None:
            os.environ.pop("GIT_CEILING_DIRECTORIES")
        else:
            os.environ["GIT_CEILING_DIRECTORIES"] = env_ceiling
    assert info["commit"] is None and info["available"] is False and info["note"]
    assert "Commit: <span class=\"muted\">unknown" in page


def test_bibtex_and_plain_citation_of_people() -> None:
    cff = {"title": "Tool_X & more", "version": "1.0", "date-released": "2025-01-02",
           "license": "MIT", "url": "https://example.org/x",
           "authors": [{"given-names": "Ada", "family-names": "Lovelace"},
                       {"name": "The Team"}]}
    bib = CIT.bibtex_entry(cff)
    assert bib.startswith("@software{toolxmore2025,")
    assert "author = {Lovelace, Ada and {The Team}}" in bib
    assert r"title = {{Tool\_X \& more}}" in bib
    assert "url = {https://example.org/x}" in bib
    assert CIT.plain_citation(cff) == ("Ada Lovelace, The Team (2025). Tool_X & more (Version 1.0) "
                                     "[Computer software]. License: MIT. https://example.org/x")


def test_repository_citation_file_is_valid() -> None:
    cff = CIT.read_citation(CITATION)
    assert cff["cff-version"] == "1.2.0"
    assert cff["version"] == "0.1.0" and cff["license"] == "MIT"
    ids = {i["value"] for ref in cff["references"] for i in ref.get("identifiers", [])}
    assert ids == {"arXiv:2607.01678", "arXiv:2505.16363"}
    assert len(cff["references"]) == 3


@pytest.mark.parametrize("broken, name", [
    ("params", "params_path"), ("manifest", "manifests"), ("citation", "citation_path"),
    ("reports", "reports_dir"), ("manifest_splits", "manifests"),
])
def test_bad_inputs_name_the_parameter(project: Path, broken: str, name: str) -> None:
    man = project / "data/prepared/shakespeare/manifest.json"
    if broken == "params":
        (project / "params.yaml").unlink()
    elif broken == "manifest":
        man.unlink()
    elif broken == "manifest_splits":
        man.write_text(json.dumps({"corpus": "x"}), encoding="utf-8")
    elif broken == "citation":
        (project / "CITATION.cff").write_text("title: only\n", encoding="utf-8")
    elif broken == "reports":
        shutil.rmtree(project / "reports")
    with pytest.raises(ParameterError) as info:
        build(project, repo_dir=project)
    assert info.value.name == name
    assert not (project / "reports" / "index.html").exists()


@pytest.mark.parametrize("manifest", [
    {"train": {"sha256": "c" * 64, "n_bytes": 7}},                       # split at top level
    {"name": "enwik8", "splits": [{"name": "test", "sha256": "d" * 64, "bytes": 5}]},
    {"splits": {"test": {"sha256": "d" * 64, "bytes": 5}}},
    {"files": {"train": {"file": "train.bin", "sha256": "a" * 64, "bytes": 9}}},  # no format
])
def test_only_the_prepared_manifest_format_is_read(tmp_path: Path, manifest: dict) -> None:
    """Shapes the package never writes are refused, naming the format it does write."""
    path = tmp_path / "a" / "manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ParameterError, match="lmrepro.prepared/1") as info:
        R.read_manifest(path)
    assert info.value.name == "manifests"


def test_manifest_without_source_is_named_by_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "enwik8" / "manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"format": "lmrepro.prepared/1", "source": {}, "files": {
        "test": {"file": "test.bin", "sha256": "d" * 64, "bytes": 5}}}), encoding="utf-8")
    assert R.read_manifest(path) == [{"manifest": str(path), "corpus": "enwik8", "split": "test",
                                      "file": "test.bin", "sha256": "d" * 64, "bytes": 5}]


def test_index_opens_with_results_at_a_glance(project: Path) -> None:
    """Claims table, scale sentence, forest plot (embedded), stage wall times, CPU model,
    result hashes, collapsed parameters and the BibTeX of every reproduced work."""
    import base64

    res = project / "results"
    (res / "analysis").mkdir(parents=True)
    (res / "analysis" / "claims.csv").write_text(
        "id,paper,claim,paper_figure,paper_scale,measured,measured_value,our_scale,corpus,rule,"
        "verdict,caveats\n"
        "a,P,Claim <A>,paper: 1.382x,31 cores,0.9x tokens/s,0.9,4 threads; 2 seeds,x,r,"
        "inconclusive,timing difference inside the step-time spread (±40%)\n"
        "b,P,Claim B,paper: comparable,32 GPUs,mean d +0.5 %,0.005,2 seeds,x,r,reproduced,\n"
        "c,P,Claim C,paper: > 2.5 % worse,31 cores,not run in this profile,,,,r,not run,\n")
    png = base64.b64decode(  # a 1x1 PNG
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5"
        "ErkJggg==")
    (res / "analysis" / "forest.png").write_bytes(png)
    (res / "params.json").write_text(json.dumps({
        "profile": "default", "seeds": [0, 1], "model": {"n_layers": 4, "d_model": 128},
        "train": {"steps": 400}, "scape": {"runs": [{}, {}], "steps": 150, "world_size": 2,
                                           "corpus": "shakespeare"}}))
    (project / "reports" / "02_rgc.ipynb").write_text(json.dumps(
        {"metadata": {"papermill": {"duration": 192.4}}, "cells": []}))
    page = build(project, repo_dir=project, claims_csv=res / "analysis" / "claims.csv",
                 forest_png=res / "analysis" / "forest.png", resolved_params=res / "params.json",
                 result_files=[res / "params.json", res / "analysis" / "claims.csv",
                               res / "missing.json"]).read_text(encoding="utf-8")
    glance = page.index("Results at a glance")
    assert glance < page.index("<h2>Reports</h2>") < page.index("How to cite")
    assert page.index("This run (profile &#x27;default&#x27;, 2 training seeds 0, 1)") > glance
    assert "SCAPE suite: 2 runs of a 4-layer, d=128 model, 150 steps, 2 workers" in page
    # one short row per claim: the claim, the paper's figure, ours in brief, the verdict and
    # the number of its note, which holds the scales and the caveats
    table = page[page.index("<table>", glance):page.index("</table>", glance)]
    assert table.count('<td class="txt verdict-') == 3 and table.count("<tr>") == 4
    assert '<td class="txt verdict-inconclusive">inconclusive</td>' in table
    assert "Claim &lt;A&gt;" in table and "paper: 1.382x" in table
    assert "31 cores" not in table and "±40%" not in table
    assert '<a href="#note-1">1</a>' in table and '<a href="#note-3">3</a>' in table
    notes = page[page.index('<ol class="notes">'):]
    assert "31 cores" in notes and "timing difference inside the step-time spread (±40%)" in notes
    assert notes.index('id="note-1"') < notes.index('id="note-2"') < notes.index('id="note-3"')
    # a legend says what each verdict present means, and how many rows have it
    legend = page[page.index("What the verdicts mean"):page.index('<ol class="notes">')]
    assert "the measurement cannot decide" in legend and "does not run what" in legend
    assert "not testable here" not in legend
    # the forest plot is in the page itself; nothing is loaded from elsewhere
    assert page.count("<img") == 1
    assert re.findall(r'src="([^"]{0,22})', page) == ["data:image/png;base64,"]
    assert base64.b64encode(png).decode() in page
    for bad in ("<script", "<link", "http://", "@import"):
        assert bad not in page
    # stage wall time from the executed notebook; unknown where there is none
    assert "02_rgc.html; stage ran 3 min 12 s" in page
    assert "01_scape.html; stage ran unknown" in page
    # provenance: CPU model, result hashes (missing files left out), parameters collapsed
    assert "CPU model" in page and PV.machine_info()["cpu_model"] in page
    from lmrepro.io import sha256_file

    assert sha256_file(res / "params.json") in page and "missing.json" not in page
    assert re.search(r"<details><summary>Parameters: .*?</summary>\s*<pre>train:", page, re.S)
    # BibTeX: the software with its commit; the papers; the RGC paper with its author and
    # without an invented year or identifier
    commit = PV.git_info(project)["commit"]
    assert commit is None or f"note = {{git commit {commit}" in page
    assert "eprint = {2607.01678}" in page and "eprint = {2505.16363}" in page
    assert "author = {Zheng, Mingkai and" in page
    rgc = page[page.index("@misc{lexbounded"):]
    rgc = rgc[:rgc.index("}\n")]
    assert "author = {Lex, Vikram}" in rgc and "Year, identifier unknown" in rgc
    assert "year =" not in rgc and "eprint" not in rgc
    assert "repository URL is not recorded" in page
    prov = json.loads((project / "reports" / "provenance.json").read_text(encoding="utf-8"))
    assert [c["verdict"] for c in prov["claims"]] == ["inconclusive", "reproduced", "not run"]
    assert [r["duration_s"] for r in prov["reports"]] == [None, 192.4, None]


def test_the_repository_url_comes_from_citation_or_the_git_remote(project: Path) -> None:
    cff = CIT.read_citation(project / "CITATION.cff")
    assert "url" not in CIT.bibtex_entry(cff)
    bib = CIT.bibtex_entry({**cff, "repository-code": "https://example.org/lmrepro"},
                         commit="abc123 (dirty)")
    assert "url = {https://example.org/lmrepro}" in bib
    assert "note = {git commit abc123 (dirty)}" in bib
    if shutil.which("git"):
        git(project, "init", "-q")
        git(project, "remote", "add", "origin", "https://example.org/from-remote.git")
        page = build(project, repo_dir=project).read_text(encoding="utf-8")
        assert "url = {https://example.org/from-remote.git}" in page
        assert "repository URL is not recorded" not in page
        # a clone of a local clone has a path for a remote: not a URL a reader can follow
        git(project, "remote", "set-url", "origin", str(project.parent / "elsewhere"))
        page = build(project, repo_dir=project).read_text(encoding="utf-8")
        assert "repository URL is not recorded" in page and "elsewhere}" not in page


def test_index_fits_the_window() -> None:
    """The published index was 1517 px wide in a 1400 px window (the checksum table's hashes and
    the BibTeX did not wrap): long words wrap anywhere, preformatted text wraps, and nothing
    scrolls sideways inside the page."""
    css = R._CSS
    assert "overflow-wrap:anywhere" in css and "white-space:pre-wrap" in css
    assert "pre{" in css and "overflow-x:auto" not in css.split("pre{")[1].split("}")[0]
    table = R._table(["file", "sha256"], [("a.bin", "f" * 64)])
    assert '<td class="hash">' + "f" * 64 + "</td>" in table and "<td>a.bin</td>" in table


def test_a_reports_header_names_the_profile_the_run_used(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from lmrepro.pipeline.notebook import _active_profile

    params = tmp_path / "params.yaml"
    params.write_text("profile: smoke\nprofiles: {smoke: {}, scaling: {}}\n", encoding="utf-8")
    monkeypatch.delenv("LMREPRO_PROFILE", raising=False)
    assert _active_profile(params, None) == "smoke"                 # the file's
    monkeypatch.setenv("LMREPRO_PROFILE", "scaling")
    assert _active_profile(params, None) == "scaling"               # the environment's
    assert _active_profile(params, "default") == "default"          # the notebook parameter's
