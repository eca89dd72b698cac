"""The one checkpoint manager of every trainer, and the one checkpoint format.

A run directory's ``checkpoints/`` folder holds one ``step_XXXXXXX/`` folder per checkpoint,
with ``rank<r>.pt`` per data-parallel rank (each rank saves its own state) and, for a run whose
processes each save their own share of one state, ``part<p>.pt`` beside ``rank0.pt``; and
``latest.json``, naming the last complete checkpoint, its world size and the identity of the run
that wrote it. A checkpoint becomes visible only when ``latest.json`` points at it, written
atomically after every file of the step, and older ones are removed after that: a kill at any
moment leaves the previous complete checkpoint. The checkpoints after the step counts of ``keep``
(a stable run's branch points, :mod:`lmrepro.scape.study.branches`) are due whatever the cadence
and outlive the rotation: once published, each is hard-linked (copied where links fail) into
``kept_checkpoints/step_XXXXXXX/`` beside ``checkpoints/``, with ``kept.json`` (its step, world
size and identity), the same files as a rotating checkpoint.

:class:`Checkpoints` is one run's manager: its run directory, its identity (what a checkpoint
must share with the run that resumes it), its cadence and its world size. The harness
(:class:`lmrepro.harness.Run`) builds it as ``run.checkpoints``; every trainer asks it whether a
checkpoint is due, saves and publishes through it and resumes from it, and every file operation
on a checkpoint goes through it. A checkpoint of another identity or world size is refused with
one line naming what differs; a damaged one raises :class:`CheckpointError` naming the file and
how to start over (move the run directory aside; nothing here deletes a run).

The state in a checkpoint is the trainer's; :func:`single_model_state` is the layout the
trainers of one whole model share (the baseline, the RGC executors).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmrepro.errors import ParameterError, check
from lmrepro.io import (DamagedFileError, atomic_torch_save, atomic_write_json, read_json,
                        torch_load)
from lmrepro.lifetime import fault_point

if TYPE_CHECKING:     # torch only for the hints: the manager itself reads JSON without it
    import torch

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
#: the folder of the checkpoints kept after the steps of ``Checkpoints.keep``, and each one's record
KEPT_CHECKPOINTS = "kept_checkpoints"
KEPT = "kept.json"
#: the optimizer's name in a :func:`single_model_state`'s ``optims`` when one optimizer holds
#: every parameter
ALL = "all"
#: at most this many differing settings are spelled out when a checkpoint is refused
SHOWN_DIFFERENCES = 4


class CheckpointError(ParameterError):
    """A checkpoint that cannot be resumed: the message names the file and how to start over."""

    def __init__(self, path: str | Path, run_dir: str | Path, problem: str) -> None:
        run_dir = Path(run_dir)
        super().__init__("checkpoint", str(path),
                         f"{problem}; to start the run over, move its directory aside "
                         f"(mv {run_dir} {run_dir}.damaged) and run again")


@dataclass(frozen=True)
class Checkpoints:
    """One run's checkpoints (see the module's docstring).

    A checkpoint is due every ``every`` steps before the last (0: none) and after the last
    (``steps``) when ``last``. Without a run directory (``run_dir=None``) due-ness is still
    answered, nothing is written (:meth:`commit`) and nothing resumes (:meth:`load`).
    ``world_size`` is the number of ranks that save their own state; the checkpoints after the
    step counts in ``keep`` are due too and kept (:meth:`kept_dir`)."""

    run_dir: Path | None
    identity: Mapping[str, Any]
    steps: int
    every: int = 0
    last: bool = False
    world_size: int = 1
    keep: frozenset[int] = frozenset()

    # -- the cadence ------------------------------------------------------------------------------
    def due(self, done: int) -> bool:
        """Whether a checkpoint is due after ``done`` completed steps."""
        if done == self.steps:
            return self.last
        return done in self.keep or (bool(self.every) and done % self.every == 0)

    # -- where ------------------------------------------------------------------------------------
    @property
    def on_disk(self) -> bool:
        """Whether checkpoints are written (the run has a run directory)."""
        return self.run_dir is not None

    @property
    def folder(self) -> Path:
        """``run_dir/checkpoints`` (a run directory is required)."""
        if self.run_dir is None:
            raise ValueError("a run without a run directory has no checkpoints")
        return self.run_dir / CHECKPOINTS

    def step_dir(self, step: int) -> Path:
        """The folder of the checkpoint after ``step`` steps."""
        return self.folder / f"step_{step:07d}"

    def kept_dir(self, step: int) -> Path:
        """Where the checkpoint after ``step`` (a step of ``keep``) is kept, out of the
        rotation: ``run_dir/kept_checkpoints/step_XXXXXXX``."""
        if self.run_dir is None:
            raise ValueError("a run without a run directory keeps no checkpoints")
        return self.run_dir / KEPT_CHECKPOINTS / f"step_{step:07d}"

    def exists(self) -> bool:
        """Whether the run directory holds any checkpoint, complete or not."""
        return self.on_disk and self.folder.exists()

    # -- saving and publishing --------------------------------------------------------------------
    def save(self, step: int, state: Mapping[str, Any], rank: int = 0) -> None:
        """Write ``rank``'s state after ``step`` (atomically); not visible until published."""
        atomic_torch_save({"step": int(step), "rank": int(rank), **state},
                          self.step_dir(step) / f"rank{rank}.pt")

    def save_part(self, step: int, part: int, state: Mapping[str, Any]) -> Path:
        """Write process ``part``'s share of the state after ``step`` beside that step's
        checkpoint (atomically), so no state travels through one process; the checkpoint (rank
        0's file) names how many parts it has and is complete once published."""
        path = self.step_dir(step) / f"part{part}.pt"
        atomic_torch_save({"step": int(step), "part": int(part), **state}, path)
        return path

    def publish(self, step: int) -> None:
        """Point ``latest.json`` at ``step`` (every file of it saved), then remove the older
        checkpoints (a newer one being written is kept)."""
        name = self.step_dir(step).name
        atomic_write_json(self.folder / LATEST,
                          {"step": int(step), "dir": name, "world_size": int(self.world_size),
                           "identity": dict(self.identity)})
        fault_point(f"checkpoint-published@{step}")   # test hook: killed right after a checkpoint
        if step in self.keep:
            self._keep(step)
        for old in self.folder.glob("step_*"):
            # only older ones: a newer step's folder may already hold the parts of processes
            # running ahead (lmrepro.rgc.executors.async_)
            if old.name < name:
                shutil.rmtree(old, ignore_errors=True)

    def _keep(self, step: int) -> None:
        """Hard-link the published checkpoint of ``step`` into :meth:`kept_dir` (a complete
        folder appears at once: built aside, then renamed; the files are never rewritten in
        place, so a link shares them safely)."""
        dst = self.kept_dir(step)
        if dst.exists():
            return
        tmp = dst.with_name(dst.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in sorted(self.step_dir(step).iterdir()):
            try:
                os.link(f, tmp / f.name)
            except OSError:          # a file system without hard links: a copy
                shutil.copy2(f, tmp / f.name)
        atomic_write_json(tmp / KEPT, {"step": int(step), "world_size": int(self.world_size),
                                       "identity": dict(self.identity)})
        tmp.rename(dst)

    def commit(self, step: int, state: Mapping[str, Any], rank: int = 0,
               barrier: Callable[[str], None] | None = None) -> None:
        """Save ``rank``'s state; with several ranks pass the ``barrier`` every rank reaches once
        it saved; rank 0 then publishes. Nothing without a run directory."""
        if not self.on_disk:
            return
        self.save(step, state, rank)
        if barrier is not None:
            barrier(f"checkpoint barrier at step {step}")
        if rank == 0:
            self.publish(step)

    def drop_unpublished(self, step: int) -> None:
        """Remove step ``step``'s folder unless it is the latest checkpoint (parts written only
        to hand the final state over)."""
        latest = self.latest()
        d = self.step_dir(step)
        if latest is None or latest.get("dir") != d.name:
            shutil.rmtree(d, ignore_errors=True)

    # -- resuming ---------------------------------------------------------------------------------
    def latest(self) -> dict[str, Any] | None:
        """``latest.json``, or None when there is no complete checkpoint (or no run directory)."""
        if not self.on_disk:
            return None
        path = self.folder / LATEST
        if not path.exists():
            return None
        try:
            latest = read_json(path)
        except (DamagedFileError, UnicodeDecodeError, ValueError) as err:
            raise CheckpointError(path, self._run_dir, f"is damaged ({err})") from None
        if not (isinstance(latest, dict) and isinstance(latest.get("step"), int)
                and isinstance(latest.get("dir"), str)):
            raise CheckpointError(path, self._run_dir,
                                  "is damaged (not the record a checkpoint writes)")
        return latest

    def load(self, rank: int = 0) -> dict[str, Any] | None:
        """``rank``'s state of the last complete checkpoint, or None if there is none.

        Refuses a checkpoint written by another identity (naming the settings that differ) or
        world size: resuming it would silently mix two runs."""
        latest = self.latest()
        if latest is None:
            return None
        diff = differences(latest.get("identity", {}), self.identity)
        if diff:
            raise ParameterError(
                "run directory", str(self.run_dir),
                f"holds a checkpoint of a different run (differs in {diff}); use a fresh run "
                "directory, or move this one aside to start over")
        check(int(latest.get("world_size", 1)) == self.world_size, "world size", self.world_size,
              f"must equal the checkpoint's {latest.get('world_size')} to resume {self.run_dir}")
        return _read_state(self.folder / latest["dir"] / f"rank{rank}.pt", self._run_dir,
                           int(latest["step"]), "the checkpoint directory is incomplete",
                           "latest.json says")

    def load_part(self, step: int, part: int) -> dict[str, Any]:
        """Process ``part``'s share saved by :meth:`save_part` (a clear error when missing or
        damaged)."""
        return _read_state(self.step_dir(step) / f"part{part}.pt", self._run_dir, int(step),
                           "the checkpoint's parts are incomplete", "its checkpoint is of step")

    @property
    def _run_dir(self) -> Path:
        return self.folder.parent


def differences(have: Mapping[str, Any], want: Mapping[str, Any]) -> str:
    """The settings in which the identity ``want`` differs from a checkpoint's ``have``, on one
    line: each by its dotted key path with both values (``settings.lr (checkpoint 0.003, now
    0.001)``); empty when they agree. ``want`` is compared as JSON, as the checkpoint stored it;
    a top-level key one side lacks counts as None (identities that gained a setting set to None
    still resume)."""
    now = json.loads(json.dumps(dict(want), sort_keys=True, default=str))
    found = [d for k in sorted(set(now) | set(have)) if have.get(k) != now.get(k)
             for d in _differing(k, have.get(k), now.get(k))]
    shown = [f"{k} (checkpoint {_show(a)}, now {_show(b)})" for k, a, b in
             found[:SHOWN_DIFFERENCES]]
    rest = [k for k, _, _ in found[SHOWN_DIFFERENCES:]]
    return ", ".join(shown) + (f" and {len(rest)} more: {', '.join(rest)}" if rest else "")


_ABSENT = object()     # a nested key one identity has and the other lacks


def _differing(key: str, a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """``(dotted key path, checkpoint's value, run's value)`` for each leaf in which the values
    ``a`` and ``b`` at ``key`` differ (lists are leaves)."""
    if a == b:
        return []
    if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
        return [(key, a, b)]
    return [d for k in sorted(set(a) | set(b))
            for d in _differing(f"{key}.{k}", a.get(k, _ABSENT), b.get(k, _ABSENT))]


def _show(v: Any) -> str:
    return "absent" if v is _ABSENT else json.dumps(v, sort_keys=True, default=str)


def _read_state(path: Path, run_dir: Path, step: int, when_missing: str, step_source: str
                ) -> dict[str, Any]:
    """One saved state of step ``step`` (a rank's or a part's), or a :class:`CheckpointError`
    saying what is wrong with the file: missing (``when_missing`` says why that matters),
    damaged, or of another step (``step_source`` names where ``step`` came from)."""
    if not path.exists():
        raise CheckpointError(path, run_dir, f"is missing ({when_missing})")
    try:
        state = torch_load(path)
    except Exception as err:  # noqa: BLE001 - torch reports damage as OSError or RuntimeError
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(path, run_dir, f"is damaged: torch cannot read it ({reason}; "
                              f"{path.stat().st_size} bytes)") from None
    if not (isinstance(state, dict) and int(state.get("step", -1)) == step):
        raise CheckpointError(path, run_dir, f"records step "
                              f"{state.get('step') if isinstance(state, dict) else None}, "
                              f"{step_source} {step}")
    return state


# ------------------------------------------------------------------------------------------------
# the state of a trainer of one whole model
# ------------------------------------------------------------------------------------------------

def single_model_state(model_state: Mapping[str, torch.Tensor], optim_states: Mapping[str, dict],
                       gen_state: torch.Tensor, **extra: Any) -> dict[str, Any]:
    """The state layout every trainer of one whole model shares: the model's weights
    (``model``), the optimizer states by name (``optims``; :data:`ALL` for one optimizer over
    every parameter), the batch generator's state (``gen_state``), and whatever else the
    trainer's next step depends on (``extra``)."""
    return {"model": model_state, "optims": dict(optim_states), "gen_state": gen_state, **extra}


def restore_single_model(ckpt: Mapping[str, Any], model: torch.nn.Module,
                         optimizers: Mapping[str, torch.optim.Optimizer],
                         generator: torch.Generator) -> None:
    """Load a :func:`single_model_state` into the model, the optimizers and the generator."""
    if "optims" not in ckpt:
        # the baseline's layout before the shared trainer: one optimizer, other key names
        ckpt = single_model_state(ckpt["model"], {ALL: ckpt["optimizer"]}, ckpt["generator"])
    model.load_state_dict(ckpt["model"])
    for name, opt in optimizers.items():
        opt.load_state_dict(ckpt["optims"][name])
    generator.set_state(ckpt["gen_state"])
