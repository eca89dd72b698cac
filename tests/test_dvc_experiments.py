"""`dvc exp run -S profile=NAME` edits one line of params.yaml: the file is laid out the way DVC's
own YAML writer (ruamel.yaml, round-trip mode) writes it back, so an experiment's diff is the
parameter it set and nothing else."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"


def test_params_yaml_round_trips_through_dvcs_yaml_writer_unchanged() -> None:
    from dvc.utils.serialize._yaml import dumps_yaml, parse_yaml_for_update

    text = PARAMS.read_text(encoding="utf-8")
    assert dumps_yaml(parse_yaml_for_update(text, str(PARAMS))) == text


@pytest.mark.parametrize("profile", ["smoke", "reference", "scaling"])
def test_setting_the_profile_as_dvc_does_changes_one_line(tmp_path: Path, profile: str) -> None:
    """What `dvc exp run -S profile=...` does to the file (dvc.utils.hydra.apply_overrides:
    the override merged into the round-trip document, lists and nulls rewritten)."""
    from dvc.utils.hydra import apply_overrides

    copy = tmp_path / "params.yaml"
    shutil.copyfile(PARAMS, copy)
    apply_overrides(str(copy), [f"profile={profile}"])
    before = PARAMS.read_text(encoding="utf-8").splitlines()
    after = copy.read_text(encoding="utf-8").splitlines()
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert changed == [("profile: default", f"profile: {profile}")]
    # and the parameters are what they were, but the profile
    old, new = yaml.safe_load("\n".join(before)), yaml.safe_load("\n".join(after))
    assert {**old, "profile": profile} == new



def test_the_root_lock_is_never_committed_nor_ignored() -> None:
    """The root dvc.lock is the last run's own (``lmrepro publish`` copies it into
    ``published/<profile>/``): never committed, so never stale; not ignored either, since DVC
    refuses a git-ignored lock (``dvc exp run``, ``dvc metrics diff``)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    assert git("ls-files", "dvc.lock").stdout == ""
    assert git("check-ignore", "-q", "dvc.lock").returncode == 1
