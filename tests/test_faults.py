"""Every command a user runs, through every fault, with the real fault: the matrix of
docs/reliability.md ("Every command under every fault"), generated here (:mod:`_faults` says how
each fault is made and what each cell checks: one error line naming the path and what to do, no
traceback; nothing already produced lost; nothing left that git or DVC would pick up; the rerun
completes and equals an undisturbed run). Also: every temporary name the code writes is one
``.gitignore`` and ``.dvcignore`` cover.
"""

from __future__ import annotations

import json
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
