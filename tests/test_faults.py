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
from pathlib import Path

import pytest
from _faults import FAULTS, Command, run_matrix

from lmrepro.pipeline.sections import write_marked

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- lmrepro:fault-matrix:begin -->", "<!-- lmrepro:fault-matrix:end -->"
#: the outcome of each cell, filled by the matrix tests, written by the last test
MATRIX: dict[str, dict[str, str]] = {}


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

COMMANDS = [PUBLISH]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.name for c in COMMANDS])
def test_every_fault_on_a_command_holds(cmd: Command, tmp_path: Path) -> None:
    MATRIX[cmd.name] = run_matrix(cmd, tmp_path)


def matrix_table(matrix: dict[str, dict[str, str]]) -> str:
    head = "| command | " + " | ".join(FAULTS) + " |\n|---|" + "---|" * len(FAULTS) + "\n"
    rows = "".join(f"| `lmrepro {' '.join(c.argv[:1])}` | "
                   + " | ".join(matrix[c.name][f] for f in FAULTS) + " |\n"
                   for c in COMMANDS if c.name in matrix)
    return head + rows


@pytest.mark.slow
def test_the_fault_matrix_in_the_docs_is_the_one_measured() -> None:
    """Writes the table when every command ran (in this session, above); fails when a cell was
    not run here (no root for the tmpfs) or a command's tests did not run."""
    missing = [c.name for c in COMMANDS if c.name not in MATRIX]
    if missing:
        pytest.skip(f"the matrix of {missing} did not run in this session")
    not_run = [(c, f) for c, row in MATRIX.items() for f, o in row.items()
               if o.startswith("not run")]
    assert not not_run, f"cells not run here: {not_run}"
    write_marked(DOC, BEGIN, END, BEGIN + "\n" + matrix_table(MATRIX) + END)


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
