"""Publishing a finished run, its page and the README's verdicts generated from what is
published (never typed), and the README itself: short, every link resolving."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from _runs import make_run

from lmrepro.errors import ParameterError
from lmrepro.io import atomic_write_json, read_json, sha256_file
from lmrepro.pipeline import analysis as A
from lmrepro.pipeline import claims as C
from lmrepro.pipeline import headline as H
from lmrepro.pipeline import pages as G
from lmrepro.pipeline import publish as P
from lmrepro.pipeline import sections as S
from lmrepro.pipeline import timing_history as T
from lmrepro.pipeline.records import read_analysis
from lmrepro.pipeline.report import build_index
from lmrepro.rundirs import IDENTITY, prepare_runs_dir
from lmrepro.stats import StatsConfig

ROOT = Path(__file__).resolve().parents[1]
RUNS_IDENTITY = {"rgc": {"steps": 10}, "data": {"shakespeare": "abc"}}
STATS = StatsConfig(n_resamples=500)
README = f"# x\n\n## Results\n\n{S.BEGIN}\nold text\n{S.END}\n\n## Explore\n\nmore\n"


def finished_run(root: Path, profile: str = "reference") -> Path:
    """A finished run as the pipeline leaves it: runs (with checkpoints), analyses, claims,
    reports and the index."""
    atomic_write_json(root / "results/params.json", {"profile": profile, "seeds": [0, 1]})
    for seed in (0, 1):
        where = root / "results/rgc/runs/shakespeare" / f"seed{seed}"
        for name, method, executor in [("backprop", "backprop", "backprop"),
                                       ("rgc-async", "rgc", "async")]:
            run = make_run(where, name, method, seed=seed, rel=0.004 * (method == "rgc"),
                           details={"executor": executor})
            (run / "checkpoints" / "step_0000010").mkdir(parents=True)
            (run / "checkpoints" / "step_0000010" / "rank0.pt").write_bytes(b"weights")
    atomic_write_json(root / "results/rgc/runs" / IDENTITY, RUNS_IDENTITY)
    atomic_write_json(root / "results/rgc/metrics.json", {"x": 1})
    (root / "results/rgc/loss_curve.csv").write_text("run,step,loss\n")
    A.analysis_stage("rgc", STATS, root / "results", root / "results/analysis", seeds=[0, 1])
    C.claims_stage(root / "results/analysis", root / "results/analysis")
    (root / "reports").mkdir()
    (root / "reports/07_analysis_rgc.html").write_text("<html><h1>RGC</h1></html>")
    (root / "reports/07_analysis_rgc.ipynb").write_text("{}")
    (root / "params.yaml").write_text("profile: reference\n")
    (root / "CITATION.cff").write_text((ROOT / "CITATION.cff").read_text())
    build_index(root / "reports", root / "params.yaml", [], root / "CITATION.cff",
                out=root / "reports/index.html", repo_dir=root,
                claims_csv=root / "results/analysis/claims.csv",
                forest_png=root / "results/analysis/forest.png",
                resolved_params=root / "results/params.json")
    (root / "README.md").write_text(README)
    write_lock(root)
    return root


def write_lock(root: Path) -> None:
    """The dvc.lock `dvc repro` leaves: the hashes of what its stages wrote."""
    outs = [{"path": rel, "md5": hashlib.md5((root / rel).read_bytes()).hexdigest()}
            for rel in P.LOCKED]
    (root / "dvc.lock").write_text(json.dumps(
        {"schema": "2.0", "stages": {"validate": {"outs": outs[:1]},
                                     "report": {"outs": outs[1:]}}}))


def test_publish_copies_the_small_products_and_writes_the_results_section(
        tmp_path: Path) -> None:
    root = finished_run(tmp_path / "proj")
    dest = P.publish(root)
    assert dest == root / "published" / "reference"
    files = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert "results/analysis/claims.csv" in files and "reports/index.html" in files
    assert "results/analysis/rgc/analysis.json" in files and "results/params.json" in files
    assert "results/rgc/runs/shakespeare/seed1/rgc-async/eval_losses.json" in files
    assert "results/rgc/runs/shakespeare/seed1/rgc-async/summary.json" in files
    # no checkpoint, no per-step log, no executed notebook
    assert not any("checkpoints" in f or f.endswith((".pt", ".jsonl", ".ipynb")) for f in files)
    manifest = read_json(dest / P.MANIFEST)
    # every file but the page, which is generated from them
    assert manifest["profile"] == "reference"
    assert set(manifest["files"]) == files - {P.MANIFEST, G.PAGE}
    assert all(sha256_file(dest / f) == e["sha256"] for f, e in manifest["files"].items())
    # the README's section is generated from the published files, the rest is kept
    text = (root / "README.md").read_text()
    assert "old text" not in text and text.startswith("# x\n\n## Results\n\n")
    assert text.endswith("\n\n## Explore\n\nmore\n")
    section = S.readme_section(root / "README.md")
    assert section == S.results_section(dest, "published/reference")
    claims = pd.read_csv(dest / "results/analysis/claims.csv", keep_default_na=False)
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    assert len(rows) == len(claims) and "published/reference/reports/index.html" in section
    for line, (_, claim) in zip(rows, claims.iterrows(), strict=True):
        assert line.startswith(f"| {claim['claim']} |") and f"| {claim['verdict']} |" in line
    # the run's lock and headline metrics travel with it; its page is what its files give
    assert "dvc.lock" in files and "metrics/claims/rgc-throughput.json" in files
    assert "metrics/rgc/rgc-async-vs-backprop.json" in files
    assert (dest / "README.md").read_text() == G.page_text(dest, "reference")
    assert "| --- | --- | --- | --- | --- | --- | --- |" in (dest / "README.md").read_text()
    # publishing again replaces the copy in place
    assert P.publish(root) == dest and not list(dest.parent.glob(".reference*"))


@pytest.mark.parametrize("kind", P.RUN_FOLDERS)
def test_every_file_a_run_is_read_from_is_published(tmp_path: Path, kind: str) -> None:
    """A run folder of any kind (a suite's runs, a study's sweep, edge check or ablations)
    publishes what load_run reads and its folder's identity; never checkpoints or weights."""
    run = tmp_path / "results/scaling" / kind / "2x64/L300/seed0/scape90"
    names = ("summary.json", "eval_losses.json", "eval_losses_test.json")
    for name in names:
        atomic_write_json(run / name, {"losses": [1.0]})
    atomic_write_json(tmp_path / "results/scaling" / kind / "2x64/L300" / IDENTITY, {"a": 1})
    (run / "checkpoints").mkdir()
    (run / "checkpoints/rank0.pt").write_bytes(b"w")
    (run / "model_final.pt").write_bytes(b"w")
    got = {str(p) for p in P.published_files(tmp_path)}
    rel = run.relative_to(tmp_path)
    assert {str(rel / n) for n in names} | {str(rel.parents[1] / IDENTITY)} == got


def test_a_published_run_put_back_is_reused_not_set_aside(tmp_path: Path) -> None:
    """The runs folders' identities travel with a publication: copied back under a fresh
    project's results/, the runs are kept by the same identity (nothing retrains)."""
    dest = P.publish(finished_run(tmp_path / "proj"))
    assert (dest / "results/rgc/runs" / IDENTITY).is_file()
    fresh = tmp_path / "fresh"
    shutil.copytree(dest / "results", fresh / "results")
    runs = prepare_runs_dir(fresh / "results/rgc/runs", RUNS_IDENTITY)
    assert (runs / "shakespeare/seed1/rgc-async/summary.json").is_file()
    assert not list((fresh / "results/rgc").glob("runs.*"))
    # a changed identity still sets them aside
    prepare_runs_dir(fresh / "results/rgc/runs", {**RUNS_IDENTITY, "rgc": {"steps": 11}})
    assert list((fresh / "results/rgc").glob("runs.kept-*"))


def test_runs_reused_from_an_earlier_publication_keep_where_they_were_trained(
        tmp_path: Path) -> None:
    """A run whose summary is unchanged since the publication it replaces keeps that
    publication's commit and machine (through any number of republications); a retrained run
    gets this one's. The page and the README's row say so."""
    root = finished_run(tmp_path / "proj")

    def publish_as(commit: str, cpu: str) -> Path:
        prov = read_json(root / "reports/provenance.json")
        prov.update(git={"commit": commit, "dirty": False},
                    machine={"usable_cores": 2, "cpu_model": cpu})
        atomic_write_json(root / "reports/provenance.json", prov)
        write_lock(root)
        return P.publish(root)

    dest = publish_as("aaa", "Old CPU")
    assert {o["commit"] for o in G.run_origins(dest).values()} == {"aaa"}
    assert "machine" not in G.made_text(dest).split("Old CPU")[1]   # no reuse sentence
    retrained = root / "results/rgc/runs/shakespeare/seed1/backprop/summary.json"
    atomic_write_json(retrained, {**read_json(retrained), "train_time_s": 99.0})
    made = G.made_text(publish_as("bbb", "New CPU"))
    assert "3 of its 4 runs are reused unchanged from earlier publications" in made
    assert "(3 first published from commit `aaa` on 2 cores of an Old CPU)" in made
    dest = publish_as("ccc", "Newest CPU")
    origins = G.run_origins(dest)
    assert len(origins) == 4
    assert origins.pop(str(retrained.relative_to(root))) == {"commit": "bbb",
                                                             "machine": "2 cores of an New CPU"}
    assert {o["commit"] for o in origins.values()} == {"aaa"}
    assert G.cost(dest).endswith("2 cores of an Old CPU (3), 2 cores of an New CPU (1)")
    made = G.made_text(dest)
    assert "4 of its 4 runs are reused unchanged from earlier publications" in made
    assert "3 first published from commit `aaa` on 2 cores of an Old CPU; 1 first published " \
        "from commit `bbb` on 2 cores of an New CPU" in made


def test_publish_records_the_session_in_the_timing_history_once(tmp_path: Path) -> None:
    """The run's async-vs-backprop timings go to published/timing_history.json beside the
    profiles; publishing the same run again replaces its entry instead of adding one."""
    from lmrepro.pipeline import timing_history as T

    root = finished_run(tmp_path / "proj")
    P.publish(root)
    history = T.read_history(root / "published" / T.HISTORY_NAME)
    (entry,) = history.entries
    records = read_analysis(root / "results/analysis/rgc/analysis.json")
    (timed,) = [r for r in records.resources if r.candidate_role == entry.candidate_role]
    assert (entry.profile, entry.suite, entry.seeds) == ("reference", timed.suite, [0, 1])
    assert entry.throughput_ratios == timed.throughput_ratios and entry.machine == timed.machine
    P.publish(root)
    assert T.read_history(root / "published" / T.HISTORY_NAME) == history


def test_an_unfinished_or_oversized_run_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    root = finished_run(tmp_path / "proj")
    (root / "results/analysis/claims.csv").unlink()
    with pytest.raises(ParameterError, match="claims.csv") as info:
        P.publish(root)
    assert info.value.name == "run" and not (root / "published").exists()
    root = finished_run(tmp_path / "proj2")
    big = root / "results/analysis/rgc/huge.png"
    big.write_bytes(b"\0" * (P.MAX_FILE_BYTES + 1))
    with pytest.raises(ParameterError, match="huge.png"):
        P.publish(root)
    assert not (root / "published").exists()
    assert "old text" in (root / "README.md").read_text()


def test_the_readme_links_from_its_own_folder_when_the_run_is_elsewhere(tmp_path: Path) -> None:
    """A run made in another checkout, published into this one: the README's links start at
    the README's folder, not at the run's."""
    root = finished_run(tmp_path / "run")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text((root / "README.md").read_text())
    dest = P.publish(root, repo / "published" / "reference", readme=repo / "README.md")
    section = S.readme_section(repo / "README.md")
    assert section == S.results_section(dest, "published/reference")
    assert "](published/reference/reports/index.html)" in section and "../" not in section


def test_another_profile_is_published_beside_and_leaves_the_readme(tmp_path: Path) -> None:
    root = finished_run(tmp_path / "proj", profile="default")
    assert P.publish(root) == root / "published" / "default"
    assert "old text" in (root / "README.md").read_text()


def test_a_lock_that_is_not_the_runs_is_refused(tmp_path: Path) -> None:
    root = finished_run(tmp_path / "proj")
    (root / "reports/index.html").write_text("<html>a later index</html>")
    with pytest.raises(ParameterError, match="must be the lock of this run") as info:
        P.publish(root)
    assert info.value.name == "dvc.lock" and not (root / "published").exists()
    (root / "dvc.lock").unlink()
    with pytest.raises(ParameterError, match="dvc.lock"):
        P.publish(root)


def test_the_readme_lists_every_published_run_with_its_verdicts(tmp_path: Path) -> None:
    root = finished_run(tmp_path / "proj")
    (root / "README.md").write_text(f"# x\n\n{G.BEGIN}\nold\n{G.END}\n\nmore\n")
    P.publish(root)
    other = finished_run(tmp_path / "other", profile="default")
    P.publish(other, root / "published" / "default", readme=root / "README.md")
    text = (root / "README.md").read_text()
    assert "old" not in text and text.endswith(f"{G.END}\n\nmore\n")
    block = text.split(G.BEGIN, 1)[1].split(G.END, 1)[0]
    rows = [r for r in block.splitlines() if r.startswith("| `")]
    claims = pd.read_csv(root / "published/reference/results/analysis/claims.csv")
    assert [r.split("|")[1].strip() for r in rows] == ["`default`", "`reference`"]
    assert f"{len(claims)} claims: " in rows[1]
    assert "(published/reference/README.md)" in rows[1]


def test_a_study_whose_verdicts_another_row_shows_points_to_it(tmp_path: Path) -> None:
    """A study's row whose configurations all appear in a later study's row with as many seeds
    or more (and more of either) points to that row; a row whose configuration the later one
    lacks, or has with fewer seeds, keeps its own."""
    def study(name: str, candidates: dict[str, float], seeds: int = 3) -> Path:
        pub = tmp_path / "published" / name
        folder = pub / "results/analysis/rgc_scaling"
        folder.mkdir(parents=True)
        atomic_write_json(folder / "rgc_scaling.json", {"verdict": {"size": "4x64",
                                                                     "steps": 3000}})
        pd.DataFrame([{"size": "4x64", "steps": 3000, "baseline": "backprop", "candidate": c,
                       "mean": m, "lower": m - 0.01, "upper": m + 0.01, "verdict": "worse",
                       "testable": True, "seeds": seeds} for c, m in candidates.items()]
                     ).to_csv(folder / "gaps.csv", index=False)
        (pub / G.PAGE).write_text("page\n")
        return pub

    first = study("h2", {"rgc": 0.02, "rgc_H2": 0.023})
    later = study("h4", {"rgc": 0.02, "rgc_H2": 0.023, "rgc_H4": 0.02})
    more_seeds = study("h5", {"rgc": 0.021, "rgc_H2": 0.022}, seeds=5)
    fewer_seeds = study("other", {"rgc": 0.021, "rgc_H2": 0.023, "rgc_H4": 0.02, "x": 0.01},
                        seeds=2)
    runs = [first, later, more_seeds, fewer_seeds]
    assert G.contained_in(first, runs) == later                 # more configurations
    assert G.contained_in(more_seeds, runs) is None             # h4 lacks none, has fewer seeds
    assert G.contained_in(later, runs) is None and G.contained_in(fewer_seeds, runs) is None
    assert G.contained_in(first, [first, more_seeds]) == more_seeds   # more seeds
    rows = G.verdicts_table(tmp_path / "published").splitlines()
    (h2,) = [r for r in rows if r.startswith("| `h2`")]
    assert "its configurations are in `h4`'s row" in h2 and "+2.00 %" not in h2
    assert all("+2.00 %" in r or "+2.10 %" in r for r in rows if r.startswith(("| `h4`",
                                                                               "| `other`")))


def test_the_docs_sections_the_wings_generate_are_current() -> None:
    """Every docs section a wing generates from published runs (``Wing.doc_sections``, which
    ``lmrepro publish --pages-only`` writes) is what the checkout holds."""
    from lmrepro.pipeline import registry

    modules = registry.doc_sections()
    assert {"lmrepro.scape.study.review", "lmrepro.scape.study.mechanism_review"} <= set(modules)
    import importlib

    for module in modules:
        for doc, begin, end, section in importlib.import_module(module).doc_sections(ROOT):
            body = Path(doc).read_text(encoding="utf-8")
            assert begin + body.split(begin, 1)[1].split(end, 1)[0] + end == section, module


PUBLISHED = sorted(p for p in (ROOT / "published").iterdir() if (p / P.MANIFEST).is_file())


@pytest.mark.parametrize("published", PUBLISHED, ids=[p.name for p in PUBLISHED])
def test_each_published_page_and_headline_is_what_its_files_give(published: Path) -> None:
    profile = json.loads((published / P.MANIFEST).read_text())["profile"]
    assert (published / "README.md").read_text() == G.page_text(published, profile)
    # the headline metrics: one file per claim with its verdict, one per comparison with its
    # gap and bounds, as the run's claims table and analyses give them
    claims = pd.read_csv(published / "results/analysis/claims.csv", keep_default_na=False,
                         na_values=[""])
    items = H.claim_items(claims)
    assert sorted(f.stem for f in (published / "metrics/claims").glob("*.json")) == sorted(items)
    for name, item in items.items():
        got = json.loads((published / "metrics/claims" / f"{name}.json").read_text())
        # a verdict is compared in its short form (how the headline writes it now; a
        # publication made before a verdict got one holds it in full)
        short = H.SHORT_VERDICTS.get(got["verdict"], got["verdict"])
        assert set(got) <= set(H.KEYS) and short == item["verdict"]
    for stage in ("scape", "rgc"):
        analysis = published / "results/analysis" / stage / "analysis.json"
        if analysis.is_file():
            want = H.comparison_items(read_analysis(analysis).comparisons)
            for name, item in want.items():
                got = json.loads((published / "metrics" / stage / f"{name}.json").read_text())
                assert got == {k: v for k, v in item.items() if v is not None}


@pytest.mark.parametrize("published", PUBLISHED, ids=[p.name for p in PUBLISHED])
def test_every_published_pipeline_run_carries_its_own_lock(published: Path) -> None:
    """A run made by ``dvc repro`` carries its ``dvc.lock``, the one whose hashes its index and
    parameters have."""
    P.check_lock(published)


def test_a_publication_without_a_manifest_says_how_it_was_made_instead() -> None:
    """The device publications are made by a script on a lent machine, not by ``dvc repro``:
    no lock, and their page names the script and the commit."""
    for d in (ROOT / "published").iterdir():
        if d.is_dir() and not (d / P.MANIFEST).is_file():
            text = (d / "README.md").read_text()
            assert re.search(r"Made with `bash scripts/[\w-]+\.sh` at commit `[0-9a-f]{7,}`",
                             text), d.name


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 10 * 1024
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    for link in links:
        if not re.match(r"[a-z]+://", link):
            assert (ROOT / link).exists(), link
    # the verdicts are what is published: one row per published run, linking to its page
    assert text.split(G.BEGIN, 1)[1].split(G.END, 1)[0] == \
        G.verdicts_table(ROOT / "published").split(G.BEGIN, 1)[1].split(G.END, 1)[0]
    for run in G.published_runs(ROOT / "published"):
        assert f"(published/{run.name}/README.md)" in text


def test_the_published_reference_claims_are_what_its_analysis_gives() -> None:
    """The published reference run's claims table is what its analysis files give."""
    published = ROOT / "published" / "reference"
    page = (published / "README.md").read_text()
    table = pd.read_csv(published / "results/analysis/claims.csv", keep_default_na=False,
                        na_values=[""])
    if S.stale_claims(table):
        # made under older claim rules: the page must say so (its verdicts are not what
        # today's rules give), and the next reference run replaces it
        assert "predates the current claim rules" in page
        return
    # (the wording of the figures may change with the code; the numbers and verdicts may not)
    # timing verdicts rest on the sessions recorded up to this publication
    manifest = json.loads((published / P.MANIFEST).read_text())
    history = T.read_history(ROOT / "published" / T.HISTORY_FILE.name)
    history = history.model_copy(update={"entries": [
        e for e in history.entries if (e.date or "") <= manifest["published_at"]]})
    again = C.claims_table(T.pool_records(C.read_stage_records(published / "results/analysis"),
                                          history))
    assert list(table["id"]) == list(again["id"])
    assert list(table["verdict"]) == list(again["verdict"])
    for a, b in zip(table["measured_value"], again["measured_value"], strict=True):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)
    for rel, entry in manifest["files"].items():
        assert sha256_file(published / rel) == entry["sha256"], rel


def test_the_section_says_how_long_the_stages_ran(tmp_path: Path) -> None:
    pub = tmp_path / "pub"
    (pub / "reports").mkdir(parents=True)
    (pub / "results/analysis").mkdir(parents=True)
    shutil.copy(ROOT / "published/reference/results/analysis/claims.csv",
                pub / "results/analysis/claims.csv")
    prov = {"git": {"commit": "a" * 40, "dirty": False}, "machine": {"usable_cores": 2},
            "reports": [{"file": "a.html", "duration_s": 600.0},
                        {"file": "b.html", "duration_s": 1200.4},
                        {"file": "c.html", "duration_s": None}]}
    (pub / "reports/provenance.json").write_text(json.dumps(prov))
    text = S.results_section(pub)
    assert "Its 2 rendered stages ran 30 minutes (1800 s) in total" in text
    assert "runs trained for" not in text
    # the runs' own training time counts even when the stages only reused finished runs
    for i, t in enumerate((1500.0, 1260.0)):
        (pub / f"results/runs/r{i}").mkdir(parents=True)
        (pub / f"results/runs/r{i}/summary.json").write_text(json.dumps({"train_time_s": t}))
    prov["reports"] = [{"file": "c.html", "duration_s": 45.0}]
    (pub / "reports/provenance.json").write_text(json.dumps(prov))
    text = S.results_section(pub)
    assert "Its 1 rendered stages ran 45 s in total" in text
    assert "Its 2 runs trained for 46 minutes (2760 s) in total by their own clocks" in text
    prov["reports"] = [{"file": "c.html", "duration_s": None}]
    (pub / "reports/provenance.json").write_text(json.dumps(prov))
    assert "rendered stages ran" not in S.results_section(pub)


def test_a_study_gets_its_page_and_a_readme_holding_its_markers_its_section(
        tmp_path: Path) -> None:
    """A study's run (e.g. the horizon profile's): its page holds what its analysis wrote, with
    links from the page's folder; a README that holds the profile's markers gets the section."""
    pub = tmp_path / "published" / "horizon"
    (pub / "reports").mkdir(parents=True)
    (pub / "results/analysis/scaling").mkdir(parents=True)
    (pub / "results/analysis/scaling/readme_section.md").write_text(
        "Figures: [{published}/results/analysis/scaling/](x).\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    (pub / "reports/provenance.json").write_text(json.dumps(
        {"git": {"commit": "b" * 40, "dirty": False}, "generated_at": "2026-12-06T00:00:00",
         "machine": {"usable_cores": 2, "cpu_model": "AMD EPYC"}}))
    (pub / P.MANIFEST).write_text(json.dumps({"profile": "horizon", "files": {}}))
    page = G.write_page(pub).read_text()
    assert "Profile `horizon`, commit `bbbbbbbbbbbb`" in page and "2 cores of an AMD EPYC" in page
    assert "[./results/analysis/scaling/](x)" in page and "| 1 | 2 |" in page
    begin, end = S.profile_markers("horizon")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{begin}\nold\n{end}\n")
    assert S.update_profile_section(readme, pub, "horizon", "published/horizon")
    text = readme.read_text()
    assert "old" not in text and "[published/horizon/results/analysis/scaling/](x)" in text


def test_a_marked_section_is_replaced_in_place_and_writing_it_again_changes_nothing(
        tmp_path: Path) -> None:
    """One rule writes every generated section (README and docs): only the part between the
    markers changes, a second write gives the same page (no blank line creeps in, whether the
    section ends its line or not), and a page whose markers are missing, doubled or out of
    order is refused naming the page."""
    from lmrepro.errors import ParameterError
    from lmrepro.pipeline.sections import write_marked

    b, e = "<!-- x:begin -->", "<!-- x:end -->"
    page = tmp_path / "page.md"
    for section in (f"{b}\nnew\n{e}\n", f"{b}\nnew\n{e}"):
        page.write_text(f"head\n{b}\nold\nlines\n{e}\ntail\n")
        write_marked(page, b, e, section)
        assert page.read_text() == "head\n" + section.rstrip("\n") + "\ntail\n"
        write_marked(page, b, e, section)
        assert page.read_text() == "head\n" + section.rstrip("\n") + "\ntail\n"
    for bad in (f"{b}\n{e}\n{b}\n", f"{e}\n{b}\n", "no markers\n"):
        page.write_text(bad)
        with pytest.raises(ParameterError, match=r"page = .*page\.md.: must hold the markers"):
            write_marked(page, b, e, f"{b}{e}")
        assert page.read_text() == bad
