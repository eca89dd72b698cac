"""Every command a user runs, through every fault, with the real fault: the matrix of
docs/reliability.md ("Every command under every fault"), generated here (:mod:`_faults` says how
each fault is made and what each cell checks: one error line naming the path and what to do, no
traceback; nothing already produced lost; nothing left that git or DVC would pick up; the rerun
completes and equals an undisturbed run). Also: every temporary name the code writes is one
``.gitignore`` and ``.dvcignore`` cover.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _faults import FAULTS, Command, run_matrix

from lmrepro.pipeline.sections import write_marked

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- lmrepro:fault-matrix:begin -->", "<!-- lmrepro:fault-matrix:end -->"


# ------------------------------------------------------------------------------------------------
# lmrepro publish
# ------------------------------------------------------------------------------------------------

def _publish_setup(proj: Path) -> None:
    from test_publish import finished_run

    from lmrepro.pipeline.publish import publish

    finished_run(proj)
    publish(proj)                   # the previous publication, which a failed one must keep


def _published(proj: Path) -> dict[str, object]:
    """The publication, its manifest less the time it was made."""
    from _faults import files

    pub = proj / "published" / "reference"
    out: dict[str, object] = {k: v for k, v in files(pub).items() if k != "MANIFEST.json"}
    manifest = json.loads((pub / "MANIFEST.json").read_text())
    manifest.pop("published_at")
    out["MANIFEST.json"] = manifest
    out["README.md of the project"] = (proj / "README.md").read_text()
    return out


PUBLISH = Command(
    name="publish", argv=["publish"], output="published",
    kill_points=("publish-copied@0", "publish-replaced", "replace:README.md"),
    damage="reports/provenance.json", same=_published, setup=_publish_setup,
    kept=("**/*",))

# ------------------------------------------------------------------------------------------------
# the trainers: lmrepro train (the baseline stage), train-rgc, train-scape (one worker)
# ------------------------------------------------------------------------------------------------

CORPUS = "data/prepared/shakespeare"
_PREPARED: list[Path] = []


def _training_setup(proj: Path) -> None:
    """The smoke profile (one seed, 8 baseline steps) and its prepared corpus (made once)."""
    import shutil
    import subprocess
    import tempfile

    import yaml
    from _faults import env

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    smoke = raw["profiles"]["smoke"]
    smoke["seeds"] = [0]
    smoke["train"].update(steps=8, eval_every=4, checkpoint_every=4)
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    if not _PREPARED:
        made = Path(tempfile.mkdtemp(prefix="lmrepro-faults-data-"))
        shutil.copytree(ROOT / "data/embedded", made / "data/embedded")
        shutil.copyfile(proj / "params.yaml", made / "params.yaml")
        subprocess.run([sys.executable, "-m", "lmrepro", "prepare", "--profile", "smoke"],
                       cwd=made, env=env(), check=True, capture_output=True, timeout=300)
        _PREPARED.append(made)
    shutil.copytree(_PREPARED[0] / CORPUS, proj / CORPUS)


def _runs(out: Path) -> dict[str, object]:
    """Each run below ``out``: what a resumed run must share with an uninterrupted one (its
    final bits per byte, steps, tokens, evaluation losses, metrics less wall-clock seconds)."""
    from lmrepro.io import read_json, read_jsonl

    runs: dict[str, object] = {}
    for summary in sorted(out.rglob("summary.json")):
        s = read_json(summary)
        rows = [{k: v for k, v in r.items() if not k.endswith("_s")}
                for r in read_jsonl(summary.parent / "metrics.jsonl")]
        runs[str(summary.parent.relative_to(out))] = (
            s["final_bpb"], s["steps"], s["tokens"],
            read_json(summary.parent / "eval_losses.json"), rows)
    assert runs, f"no finished run below {out}"
    return runs


def _smoke(section: str) -> dict:
    import yaml

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return {**raw[section], **raw["profiles"]["smoke"][section]}


def _scape_argv() -> list[str]:
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun
    from lmrepro.scape.train.worker import worker_argv

    smoke = _smoke("scape")
    cfg = ScapeConfig(**{k: v for k, v in smoke.items() if k in ScapeConfig.model_fields})
    model = ModelConfig(**_smoke("model"))
    run = ScapeRun(name="scape-90", optimizer="scape", sparsity=0.9)
    return ["train-scape", *worker_argv(cfg, run, model, CORPUS, "results/scape-run", seed=1)]


def _rgc_config() -> str:
    from lmrepro.rgc.config import RGCConfig

    smoke = _smoke("rgc")
    return json.dumps({k: v for k, v in smoke.items() if k in RGCConfig.model_fields})


TRAIN = Command(
    name="train", argv=["train", "--profile", "smoke", "--out", "results/baseline"],
    output="results/baseline",
    kill_points=("checkpoint-published@4", "replace:summary.json", "replace:metrics.json"),
    damage=f"{CORPUS}/val.bin", same=lambda p: _runs(p / "results/baseline"),
    setup=_training_setup)
TRAIN_RGC = Command(
    name="train-rgc", argv=["train-rgc", "--executor", "sync", "--out", "results/rgc-run",
                            "--corpus-dir", CORPUS, "--config-json", _rgc_config()],
    output="results/rgc-run",
    kill_points=("checkpoint-published@3", "evaluate", "replace:summary.json"),
    damage=f"{CORPUS}/train.bin", same=lambda p: _runs(p / "results/rgc-run"),
    setup=_training_setup)
TRAIN_SCAPE = Command(
    name="train-scape", argv=_scape_argv(), output="results/scape-run",
    kill_points=("scape-step@2:rank0", "checkpoint-published@4", "replace:summary.json"),
    damage=f"{CORPUS}/val.bin", same=lambda p: _runs(p / "results/scape-run"),
    setup=_training_setup)


# ------------------------------------------------------------------------------------------------
# a pipeline stage through lmrepro notebook: the baseline's training stage
# ------------------------------------------------------------------------------------------------

def _stage_setup(proj: Path) -> None:
    import shutil

    _training_setup(proj)
    shutil.copyfile(ROOT / "dvc.yaml", proj / "dvc.yaml")
    (proj / "notebooks").mkdir()
    shutil.copyfile(ROOT / "notebooks/03_train_baseline.ipynb",
                    proj / "notebooks/03_train_baseline.ipynb")


def _stage_products(proj: Path) -> dict[str, object]:
    """The stage's runs, and that its report was rendered (its figures and tables hold the
    run's own timings)."""
    html = (proj / "reports/03_train_baseline.html").read_text()
    nb = json.loads((proj / "reports/03_train_baseline.ipynb").read_text())
    return {"runs": _runs(proj / "results/baseline"), "report": "<html" in html,
            "cells": len(nb["cells"])}


def _has(pattern: str) -> Callable[[Path], bool]:
    return lambda proj: any(proj.glob(pattern))


STAGE = Command(
    name="notebook", output="results/baseline",
    argv=["notebook", "notebooks/03_train_baseline.ipynb", "--profile", "smoke"],
    kill_points=(),
    kill_when=(("its kernel starting", _has("results/baseline/.writer.lock")),
               ("after its first checkpoint", _has("results/baseline/runs/*/*/*/checkpoints/"
                                                   "latest.json")),
               ("while it renders its report", _has("results/baseline/loss_curve.csv"))),
    damage=f"{CORPUS}/val.bin", same=_stage_products, setup=_stage_setup,
    kept=())

COMMANDS = [TRAIN, TRAIN_RGC, TRAIN_SCAPE, STAGE, PUBLISH]


def _label(cmd: Command) -> str:
    return f"`lmrepro {' '.join(cmd.argv[:2 if cmd.argv[0] == 'notebook' else 1])}`"


def matrix_section(doc_text: str, cmd: Command) -> str:
    """The docs' table with ``cmd``'s row measured now: the other commands' rows as the page
    holds them (each written by its own run of this test), in :data:`COMMANDS`' order, and the
    commands not measured yet named below it."""
    body = doc_text.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in doc_text else ""
    rows = {line.split(" | ")[0][2:]: line for line in body.splitlines()
            if line.startswith("| `lmrepro ")}
    rows[_label(cmd)] = (f"| {_label(cmd)} | "
                         + " | ".join(cmd.outcomes[f] for f in FAULTS) + " |")
    head = "| command | " + " | ".join(FAULTS) + " |\n|---|" + "---|" * len(FAULTS) + "\n"
    table = "".join(rows[_label(c)] + "\n" for c in COMMANDS if _label(c) in rows)
    missing = [_label(c) for c in COMMANDS if _label(c) not in rows]
    note = (f"\nNot measured yet: {', '.join(missing)}.\n" if missing else "")
    return f"{BEGIN}\n{head}{table}{note}{END}"


@pytest.mark.slow
@pytest.mark.timeout(2400)     # about a minute a command on 2 idle cores; far more beside others
@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.name for c in COMMANDS])
def test_every_fault_on_a_command_holds(cmd: Command, tmp_path: Path) -> None:
    """Every cell of the command's row holds (else the test fails where it did not); the row
    then goes into docs/reliability.md's table. A cell that cannot be made here (no root for
    the tmpfs) fails the test: the table holds only what was measured."""
    run_matrix(cmd, tmp_path)
    not_run = [f for f, o in cmd.outcomes.items() if o.startswith("not run")]
    assert not not_run, f"{cmd.name}: cells not run here: {not_run}"
    write_marked(DOC, BEGIN, END, matrix_section(DOC.read_text(encoding="utf-8"), cmd))


def test_the_matrix_section_keeps_the_other_rows_and_names_the_missing() -> None:
    text = f"x\n{BEGIN}\n| command |\n| `lmrepro train` | a | b | c | d |\n{END}\n"
    PUBLISH.outcomes = dict.fromkeys(FAULTS, "held")
    try:
        section = matrix_section(text, PUBLISH)
    finally:
        PUBLISH.outcomes = {}
    assert "| `lmrepro train` | a | b | c | d |" in section
    assert "| `lmrepro publish` | held | held | held | held |" in section
    assert section.index("`lmrepro train` |") < section.index("`lmrepro publish` |")
    missing = section.split("Not measured yet: ", 1)[1]
    assert "`lmrepro train-scape`" in missing and "`lmrepro train-rgc`" in missing
    assert "`lmrepro publish`" not in missing and "`lmrepro train`," not in missing


# ------------------------------------------------------------------------------------------------
# every temporary name the code writes is ignored by git and DVC
# ------------------------------------------------------------------------------------------------

#: every place the package makes a temporary name, as the source says it: (module, the text
#: found there). A new one fails the test below until it is listed and its names checked.
TEMPORARY_MAKERS = {
    ("lmrepro/io.py", "TMP_SUFFIX"),                      # atomic writes, in the repository
    ("lmrepro/lifetime.py", "mkdtemp("),                  # scratch_dir, the one maker
    ("lmrepro/pipeline/publish.py", "scratch_dir("),      # beside published/<profile>
    ("lmrepro/pipeline/publish.py", "TMP_SUFFIX"),
    ("lmrepro/pipeline/notebook.py", "scratch_dir("),     # in $TMPDIR, outside the repository
    ("lmrepro/scape/study/scaling.py", "TMP_SUFFIX"),     # a reused run's copy
    ("lmrepro/data/embedded.py", "TemporaryDirectory("),  # in $TMPDIR
    ("lmrepro/scape/analysis/report.py", "TemporaryDirectory("),   # in $TMPDIR
}
MAKER_TEXTS = ("mkdtemp(", "mkstemp(", "TemporaryDirectory(", "NamedTemporaryFile(",
               "scratch_dir(", "TMP_SUFFIX", '".tmp"', "'.tmp'")

KILLED_WRITE = """
import sys
from lmrepro.io import atomic_write_text
atomic_write_text(sys.argv[1], "new")
"""


def test_every_maker_of_a_temporary_name_is_listed() -> None:
    src = ROOT / "src"
    found = {(str(p.relative_to(src)), text) for p in src.rglob("*.py")
             for text in MAKER_TEXTS if text in p.read_text(encoding="utf-8")
             and not (p.name == "lifetime.py" and text == "scratch_dir(")   # its definition
             and not (p.name == "io.py" and text == '".tmp"')}     # TMP_SUFFIX's definition
    assert found == TEMPORARY_MAKERS


def _names_the_code_makes(proj: Path) -> list[str]:
    """Temporaries made by the package's own code at the places a run makes them, left as a
    killed run leaves them: an atomic write killed before its rename (a product in results/,
    a headline metric in metrics/ (tracked by git), a page in published/), publish's scratch
    folder, a reused run's copy."""
    import subprocess

    from _faults import env

    from lmrepro.io import TMP_SUFFIX
    from lmrepro.lifetime import FAULT_ENV, scratch_dir
    from lmrepro.pipeline.publish import SCRATCH_TAG
    from lmrepro.scape.study.scaling import reuse_run

    for rel in ("results/scape/metrics.json", "metrics/scape/headline.json",
                "published/reference/README.md", "data/prepared/shakespeare/manifest.json"):
        target = proj / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("old")
        done = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(target)],
                              env=env(**{FAULT_ENV: f"replace:{target.name}"}), timeout=60)
        assert done.returncode == -9
    made = []
    with scratch_dir(SCRATCH_TAG, proj / "published", suffix=TMP_SUFFIX) as scratch:
        (scratch / "reference").mkdir()
        (scratch / "reference" / "MANIFEST.json").write_text("{}")
        made = [str(p.relative_to(proj)) for p in scratch.rglob("*")]
    src = proj / "results/scaling/runs/s/L8/seed1/a"
    src.mkdir(parents=True)
    (src / "summary.json").write_text(json.dumps({"name": "a"}))

    def fail(*_a: object, **_k: object) -> None:
        raise OSError("killed here")

    with pytest.MonkeyPatch.context() as mp:      # stopped where a kill would stop it
        mp.setattr("lmrepro.scape.study.scaling.atomic_write_json", fail)
        with pytest.raises(OSError):
            reuse_run(src, src.with_name("b"), "b")
    on_disk = [str(p.relative_to(proj)) for p in proj.rglob("*")
               if any(part.endswith(".tmp") for part in p.relative_to(proj).parts)]
    return sorted(set(on_disk) | set(made))


def test_git_and_dvc_ignore_every_temporary_name_the_code_makes(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from _faults import dvc_ignored, git_visible

    proj = tmp_path / "proj"
    proj.mkdir()
    for name in (".gitignore", ".dvcignore"):
        shutil.copyfile(ROOT / name, proj / name)
    subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
    names = _names_the_code_makes(proj)
    kinds = {Path(n).parts[0] for n in names}
    assert {"results", "metrics", "published", "data"} <= kinds, names
    assert any("lmrepro-publish-" in n for n in names) and any(".copying" in n for n in names)
    assert all(any(part.endswith(".tmp") for part in Path(n).parts) for n in names), names
    shown = {n for n in git_visible(proj) if n in names}
    assert not shown, f"git would pick up: {sorted(shown)}"
    assert set(names) == dvc_ignored(proj, names), sorted(set(names) - dvc_ignored(proj, names))


# ------------------------------------------------------------------------------------------------
# the one line of an OSError, from the command line and from a notebook's kernel
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("err, status, expected", [
    (PermissionError(13, "Permission denied", "results/x.json"), 1,
     "permission denied: results/x.json: make it writable for this user"),
    (OSError(30, "Read-only file system", "published/reference"), 1,
     "read-only file system: published/reference: remount it read-write"),
    (FileNotFoundError(2, "No such file or directory", "results/params.json"), 2,
     "no such file or directory: results/params.json: create it, or run the stage"),
    (OSError(28, "No space left on device", "results/a.csv", None, "published/b.csv"), 1,
     "no space left on device writing published/b.csv"),
    (RuntimeError("torch: unexpected pos"), 1, "no space left on device writing ?"),
], ids=["permission", "read-only", "missing", "full", "wrapped-full"])
def test_an_os_error_is_one_line_naming_the_path_and_what_to_do(err, status, expected, capsys
                                                                ) -> None:
    import argparse

    from lmrepro.entry import execute

    if isinstance(err, RuntimeError):           # torch wraps the writer's OSError
        err.__cause__ = OSError(28, "No space left on device")

    def fail(_args: argparse.Namespace) -> int:
        raise err

    for verbose in (False, True):
        assert execute(argparse.Namespace(func=fail, verbose=verbose)) == status
        lines = capsys.readouterr().err.splitlines()
        assert lines[-1].startswith("lmrepro: error: " + expected), lines[-1]
        assert ("Traceback (most recent call last):" in lines) == verbose   # only under -v
        if not verbose:
            assert len(lines) == 1


def test_an_os_error_in_a_notebook_kernel_reads_as_the_command_lines() -> None:
    from lmrepro.entry import notebook_error

    class CellError(Exception):
        ename = "OSError"
        evalue = "[Errno 30] Read-only file system: 'results/baseline/.writer.lock'"

    err = notebook_error(CellError())
    assert err is not None and err.status == 1
    assert str(err) == ("OSError: read-only file system: results/baseline/.writer.lock: remount "
                        "it read-write or write the output elsewhere, then run again; nothing "
                        "already written was lost")
    CellError.ename, CellError.evalue = "FileNotFoundError", "[Errno 2] No such file: 'a' -> 'b'"
    err = notebook_error(CellError())
    assert err is not None and err.status == 2 and "a (to b)" in str(err)
    CellError.ename = "ValueError"
    assert notebook_error(CellError()) is None     # not ours: keeps its traceback


def test_a_folder_is_replaced_whole_and_a_swap_cut_short_is_put_back(tmp_path, monkeypatch
                                                                     ) -> None:
    import lmrepro.io as lio

    def folder(name: str, text: str) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(text)
        return tmp_path / name

    dest, new = folder("dest", "old"), folder("new", "new")
    assert lio.replace_dir(new, dest) == new                    # swapped in one step
    assert (dest / "f").read_text() == "new" and (new / "f").read_text() == "old"
    monkeypatch.setattr(lio, "_exchange", lambda a, b: False)   # a system that cannot swap
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    newer = folder("scratch/dest", "newer")
    previous = lio.replace_dir(newer, dest)
    assert previous == scratch / "dest.previous" and (dest / "f").read_text() == "newer"
    previous.rename(scratch / "kept")
    dest.rename(previous)                  # as a kill between the two renames leaves them
    assert lio.restore_previous_dir(dest, [scratch]) == dest
    assert (dest / "f").read_text() == "newer" and not previous.exists()


def test_publish_removes_the_half_copy_an_earlier_publish_left(tmp_path) -> None:
    """What a publish of the code before its scratch folders left when killed (the issue's
    `published/.default.g8c4njis/`, `.default.old/`) is removed by the next publish."""
    from test_publish import finished_run

    from lmrepro.pipeline.publish import publish

    root = finished_run(tmp_path / "proj")
    half = root / "published" / ".reference.g8c4njis"
    (half / "results").mkdir(parents=True)
    (root / "published" / ".reference.old").mkdir()
    publish(root)
    assert sorted(p.name for p in (root / "published").iterdir()) == [
        "reference", "timing_history.json"]


def test_the_error_line_starts_a_line_of_its_own_after_a_progress_bar(capsys) -> None:
    """An error that interrupts a progress bar (a full disk during training) is printed on a
    line of its own: the bar is closed first, not after the error at exit."""
    import argparse

    from tqdm import tqdm

    from lmrepro.entry import execute

    def train(_args: argparse.Namespace) -> int:
        bar = tqdm(total=8, desc="train backprop")
        bar.update(4)
        raise OSError(28, "No space left on device", "results/run/rank0.pt")

    assert execute(argparse.Namespace(func=train, verbose=False)) == 1
    err = capsys.readouterr().err
    line = "lmrepro: error: no space left on device writing results/run/rank0.pt"
    assert any(x.startswith(line) for x in err.replace("\r", "\n").split("\n")), err
