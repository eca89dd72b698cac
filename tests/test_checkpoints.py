"""The one checkpoint manager (lmrepro.checkpoints): when a checkpoint is due, the files it
writes, publishing (the latest pointer last, older checkpoints removed), resuming against the
run's identity, and ranks and parts that save their own state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmrepro.checkpoints import CHECKPOINTS, LATEST, CheckpointError, Checkpoints
from lmrepro.errors import ParameterError
from lmrepro.lifetime import FAULT_ENV, InjectedFault

IDENTITY = {"settings": {"lr": 0.003, "steps": 10, "betas": [0.9, 0.95]}, "seed": 1,
            "executor": "sync"}


def manager(run: Path, identity: dict = IDENTITY, **kw: object) -> Checkpoints:
    return Checkpoints(run, identity, **{"steps": 10, "every": 3, **kw})  # type: ignore[arg-type]


def state(x: float) -> dict:
    return {"w": torch.full((3,), x), "note": f"state {x}"}


def visible(run: Path) -> list[str]:
    return sorted(p.name for p in (run / CHECKPOINTS).iterdir())


def test_due_every_n_steps_before_the_last_and_after_the_last_when_asked(tmp_path: Path) -> None:
    every3 = manager(tmp_path, steps=10, every=3)
    assert [d for d in range(11) if every3.due(d)] == [0, 3, 6, 9]
    assert [d for d in range(1, 11) if manager(tmp_path, steps=10, every=3, last=True).due(d)
            ] == [3, 6, 9, 10]
    # the last step counts as the last, not as a multiple of the cadence
    assert not manager(tmp_path, steps=9, every=3).due(9)
    assert [d for d in range(1, 11) if manager(tmp_path, every=0, last=True).due(d)] == [10]
    assert not any(manager(tmp_path, every=0).due(d) for d in range(1, 11))


def test_the_files_on_disk_are_the_one_format(tmp_path: Path) -> None:
    ck = manager(tmp_path, world_size=2)
    ck.save(3, state(1.0), rank=0)
    ck.save(3, state(2.0), rank=1)
    ck.publish(3)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["latest.json", "step_0000003"]
    assert sorted(p.name for p in (folder / "step_0000003").iterdir()) == ["rank0.pt",
                                                                           "rank1.pt"]
    assert json.loads((folder / "latest.json").read_text()) == {
        "step": 3, "dir": "step_0000003", "world_size": 2, "identity": IDENTITY}
    rank1 = torch.load(folder / "step_0000003" / "rank1.pt", weights_only=True)
    assert set(rank1) == {"step", "rank", "w", "note"} and (rank1["step"], rank1["rank"]) == (3, 1)


def test_a_checkpoint_is_invisible_until_published(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ck = manager(tmp_path)
    assert ck.load() is None and ck.latest() is None
    ck.save(3, state(3.0))
    assert ck.load() is None                     # saved, not published: nothing to resume
    ck.publish(3)
    ck.save(6, state(6.0))
    assert ck.load()["note"] == "state 3.0"      # the newer one is not yet published
    # killed while the pointer is written: the new pointer complete but not yet renamed
    monkeypatch.setenv(FAULT_ENV, f"replace:{LATEST}=raise")
    with pytest.raises(InjectedFault):
        ck.publish(6)
    assert ck.latest()["step"] == 3 and ck.load()["note"] == "state 3.0"
    assert visible(tmp_path) == [LATEST, "step_0000003", "step_0000006"]
    # killed while a rank writes its file: no half file under the rank's name
    monkeypatch.setenv(FAULT_ENV, "replace:rank0.pt=raise")
    with pytest.raises(InjectedFault):
        ck.save(9, state(9.0))
    assert not (ck.step_dir(9) / "rank0.pt").exists()
    assert list(ck.step_dir(9).iterdir()) == []
    monkeypatch.delenv(FAULT_ENV)
    ck.publish(6)
    assert ck.load()["note"] == "state 6.0"


def test_publishing_removes_the_older_checkpoints_and_keeps_a_newer_one(tmp_path: Path) -> None:
    ck = manager(tmp_path)
    for step in (3, 6):
        ck.save(step, state(step))
        ck.publish(step)
    ck.save_part(9, 0, state(9.0))             # a process running ahead already saved its part
    assert visible(tmp_path) == [LATEST, "step_0000006", "step_0000009"]
    ck.save(9, state(9.0))
    ck.publish(9)
    assert visible(tmp_path) == [LATEST, "step_0000009"]


def test_commit_saves_then_passes_the_barrier_then_rank_0_publishes(tmp_path: Path) -> None:
    seen: list[str] = []
    ck = manager(tmp_path, world_size=2)

    def barrier(what: str) -> None:
        seen.append(f"{what}: {sorted(p.name for p in ck.step_dir(3).iterdir())}, "
                     f"latest {ck.latest()}")

    ck.commit(3, state(1.0), rank=1, barrier=barrier)
    assert ck.latest() is None                    # rank 1 never publishes
    ck.commit(3, state(0.0), rank=0, barrier=barrier)
    assert seen == ["checkpoint barrier at step 3: ['rank1.pt'], latest None",
                    "checkpoint barrier at step 3: ['rank0.pt', 'rank1.pt'], latest None"]
    assert ck.load(rank=1)["note"] == "state 1.0" and ck.load(rank=0)["note"] == "state 0.0"


def test_each_rank_resumes_its_own_state_and_a_missing_rank_is_named(tmp_path: Path) -> None:
    ck = manager(tmp_path, world_size=3)
    for rank in (0, 1):
        ck.save(6, state(rank), rank=rank)
    ck.publish(6)
    assert torch.equal(ck.load(rank=1)["w"], torch.full((3,), 1.0))
    with pytest.raises(CheckpointError, match=r"rank2\.pt.*is missing") as info:
        ck.load(rank=2)
    assert f"mv {tmp_path} {tmp_path}.damaged" in str(info.value)
    with pytest.raises(ParameterError, match=r"world size = 2: must equal the checkpoint's 3"):
        manager(tmp_path, world_size=2).load()


def test_another_identity_is_refused_on_one_line_naming_the_setting(tmp_path: Path) -> None:
    ck = manager(tmp_path)
    ck.save(3, state(3.0))
    ck.publish(3)
    other = {**IDENTITY, "settings": {**IDENTITY["settings"], "lr": 0.001}}
    with pytest.raises(ParameterError, match="different run") as info:
        manager(tmp_path, other).load()
    message = str(info.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "settings.lr (checkpoint 0.003, now 0.001)" in message
    assert "steps" not in message and "seed" not in message     # only what differs
    with pytest.raises(ParameterError, match=r"differs in executor \(checkpoint \"sync\", now "
                                             r"\"async\"\)"):
        manager(tmp_path, {**IDENTITY, "executor": "async"}).load()
    with pytest.raises(ParameterError, match=r"settings\.extra \(checkpoint absent, now 1\)"):
        manager(tmp_path, {**IDENTITY, "settings": {**IDENTITY["settings"], "extra": 1}}).load()
    many = {f"k{i}": i for i in range(6)}
    with pytest.raises(ParameterError, match=r"k3 \(checkpoint null, now 3\) and 2 more: k4, k5\)"
                       ) as info:
        manager(tmp_path, {**IDENTITY, **many}).load()
    assert "k0 (checkpoint null, now 0)" in str(info.value)
    # a setting added since, as None, is the same run (older checkpoints still resume)
    assert manager(tmp_path, {**IDENTITY, "added": None}).load()["note"] == "state 3.0"


def test_a_damaged_pointer_or_file_names_it(tmp_path: Path) -> None:
    ck = manager(tmp_path)
    ck.save(3, state(3.0))
    ck.publish(3)
    ck.step_dir(3).joinpath("rank0.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"rank0\.pt.*damaged: torch cannot read it"):
        ck.load()
    ck.save(3, state(3.0))
    (tmp_path / CHECKPOINTS / LATEST).write_text(json.dumps(
        {"step": 6, "dir": "step_0000003", "world_size": 1, "identity": IDENTITY}))
    with pytest.raises(CheckpointError, match=r"records step 3, latest.json says 6"):
        ck.load()
    (tmp_path / CHECKPOINTS / LATEST).write_text('{"step": 6')
    with pytest.raises(CheckpointError, match=r"latest.json.*is damaged.*mv "):
        ck.latest()


def test_parts_saved_by_each_process_and_dropped_unless_published(tmp_path: Path) -> None:
    ck = manager(tmp_path)
    for part in (0, 1):
        ck.save_part(3, part, state(10.0 + part))
    assert ck.load_part(3, 1)["note"] == "state 11.0" and ck.load_part(3, 1)["part"] == 1
    with pytest.raises(CheckpointError, match=r"part2\.pt.*parts are incomplete"):
        ck.load_part(3, 2)
    ck.save(3, {"parts": 2})
    ck.publish(3)
    ck.drop_unpublished(3)                        # the latest: kept
    assert ck.load()["parts"] == 2 and ck.load_part(3, 0)["note"] == "state 10.0"
    ck.save_part(5, 0, state(5.0))               # the final hand-over, never published
    ck.drop_unpublished(5)
    assert not ck.step_dir(5).exists() and ck.step_dir(3).exists()


def test_without_a_run_directory_nothing_is_written_or_resumed(tmp_path: Path) -> None:
    ck = Checkpoints(None, IDENTITY, steps=4, every=2, last=True)
    assert [d for d in range(1, 5) if ck.due(d)] == [2, 4]
    assert not ck.on_disk and not ck.exists()
    ck.commit(2, state(2.0))
    assert ck.load() is None and ck.latest() is None
    with pytest.raises(ValueError, match="without a run directory"):
        ck.save(2, state(2.0))
