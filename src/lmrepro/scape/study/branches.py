"""Decay branches of a warmup-stable-decay run (Hägele et al. 2024, arXiv 2405.18392): one
stable run, several final losses.

A wsd run's lr does not depend on its length until its decay starts, so one run trained at
constant lr can stand for the stable phase of every shorter run. The stable run keeps a
checkpoint after each branch point ``s`` (``keep_checkpoints_at``: kept out of the rotation in
``<run>/kept_checkpoints/step_XXXXXXX/``, :class:`lmrepro.checkpoints.Checkpoints`); a *branch*
resumes that checkpoint and trains the decay alone, to a final model scored on the validation
and test splits like any run's.

The decay of a branch at ``s`` is ``d = round(decay_fraction * s)`` steps (at least 1): 10 % of
the branch point's steps, as the issue asks, so the branch's total length is ``s + d`` (about
1.1 s) and the decay covers ``d / (s + d)`` of it (about 9.1 %), not ``decay_fraction`` of the
total as a full wsd run of that length would (:func:`lmrepro.evaluation.wsd_lr` decays over the
last ``round(decay_fraction * T)`` steps of ``T``). The branch's settings
(:func:`branch_settings`) are the stable run's with ``steps = s + d`` and ``decay_fraction =
d / (s + d)``: a full wsd run of those settings has this very schedule (warm-up and constant lr
up to ``s``, then the same linear decay to ``min_lr_ratio`` over ``d`` steps), and its warm-ups
(lr and sparsity) are the stable run's, in steps. A branch's lr at step ``i >= s`` is
``lr * (1 - (1 - min_lr_ratio) * min(1, (i - s + 1) / d))`` (:func:`branch_lr`).

A branch's run directory records its parent and branch point (``branch.json``); its checkpoint
identity is its own settings', and the parent's kept checkpoint must differ from it only in the
settings a branch changes (:data:`BRANCH_CHANGES`), or it is refused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from lmrepro.checkpoints import CHECKPOINTS, KEPT, KEPT_CHECKPOINTS, LATEST, differences
from lmrepro.errors import ParameterError, check
from lmrepro.evaluation import decay_start
from lmrepro.io import atomic_write_json, read_json
from lmrepro.model import ModelConfig
from lmrepro.results import SUMMARY
from lmrepro.scape.config import ScapeConfig, ScapeRun

#: a branch's record of its parent run and branch point
BRANCH = "branch.json"
#: the settings in which a branch differs from its stable run
BRANCH_CHANGES = ("steps", "decay_fraction", "eval_at")


def branch_decay_steps(step: int, decay_fraction: float) -> int:
    """The decay of a branch at ``step``: ``round(decay_fraction * step)`` steps, at least 1."""
    return max(1, round(decay_fraction * step))


def branch_points(steps: int, decay_fraction: float, first: int, n: int) -> list[int]:
    """``n`` log-spaced branch points from ``first`` to the start of the decay of a wsd run of
    ``steps`` (the end of its stable phase), distinct and rounded."""
    end = decay_start(steps, decay_fraction)
    check(1 <= first < end, "branch first step", first,
          f"must be in [1, {end - 1}] (the stable phase of {steps} steps ends at {end})")
    check(n >= 2, "branch points", n, "must be >= 2")
    return sorted({int(round(x)) for x in np.geomspace(first, end, n)})


def branch_lr(step: int, branch_step: int, decay_fraction: float, base_lr: float,
              min_lr_ratio: float) -> float:
    """A branch's lr at ``step >= branch_step`` (the formula of the module's docstring)."""
    d = branch_decay_steps(branch_step, decay_fraction)
    return base_lr * (1.0 - (1.0 - min_lr_ratio) * min(1.0, (step - branch_step + 1) / d))


def branch_settings(stable: ScapeConfig, step: int) -> ScapeConfig:
    """The settings of the branch at ``step`` of a wsd run of settings ``stable``: its length
    ``step + d`` and a decay fraction making its decay exactly the ``d`` steps after ``step``."""
    check(stable.lr_schedule == "wsd", "lr_schedule", stable.lr_schedule,
          "must be wsd for decay branches (the stable phase's lr must not depend on the length)")
    end = decay_start(stable.steps, stable.decay_fraction)
    first = max(stable.warmup_steps, stable.sparsity_warmup_steps + stable.dense_steps, 1)
    check(first <= step <= end, "branch point", step,
          f"must lie in the stable run's stable phase after its warm-ups: [{first}, {end}]")
    d = branch_decay_steps(step, stable.decay_fraction)
    total = step + d
    out = stable.replace(steps=total, decay_fraction=d / total, eval_at=[],
                         keep_checkpoints_at=[])
    if decay_start(total, out.decay_fraction) != step:     # float rounding: never seen
        raise ValueError(f"the branch at {step} would decay from "
                         f"{decay_start(total, out.decay_fraction)}, not {step}")
    return out


def kept_checkpoint(parent: str | Path, step: int) -> Path:
    """The stable run's checkpoint kept after ``step`` (a clear error when it kept none)."""
    d = Path(parent) / KEPT_CHECKPOINTS / f"step_{step:07d}"
    if not (d / KEPT).exists():
        have = sorted(p.name for p in (Path(parent) / KEPT_CHECKPOINTS).glob("step_*"))
        raise ParameterError("branch point", step,
                             f"{parent} kept no checkpoint after step {step} (kept: "
                             f"{have or 'none'}); train the stable run with "
                             "keep_checkpoints_at listing it")
    return d


def _without_branch_changes(identity: dict[str, Any]) -> dict[str, Any]:
    settings = {k: v for k, v in identity.get("settings", {}).items() if k not in BRANCH_CHANGES}
    return {**identity, "settings": settings}


def seed_branch(parent: str | Path, out: str | Path, step: int, identity: dict[str, Any]) -> bool:
    """Make ``out`` a run that resumes the stable run ``parent``'s checkpoint kept after
    ``step``, under the branch's checkpoint ``identity`` (its files hard-linked, copied where
    links fail; ``branch.json`` names the parent and the branch point). Nothing when ``out``
    already holds a checkpoint or a summary (returns False). Refuses a parent whose identity
    differs from the branch's in more than :data:`BRANCH_CHANGES`."""
    out = Path(out)
    if (out / SUMMARY).exists() or (out / CHECKPOINTS).exists():
        return False
    src = kept_checkpoint(parent, step)
    kept = read_json(src / KEPT)
    diff = differences(_without_branch_changes(kept["identity"]),
                       _without_branch_changes(identity))
    if diff:
        raise ParameterError("branch parent", str(parent), f"is not this branch's stable run "
                             f"(differs in {diff})")
    name = f"step_{step:07d}"
    tmp = out / f"{CHECKPOINTS}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / name).mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.name != KEPT:
            try:
                os.link(f, tmp / name / f.name)
            except OSError:
                shutil.copy2(f, tmp / name / f.name)
    atomic_write_json(out / BRANCH, {
        "parent": str(Path(parent).resolve()), "branch_step": int(step),
        "decay_steps": int(identity["settings"]["steps"]) - int(step),
        "total_steps": int(identity["settings"]["steps"])})
    atomic_write_json(tmp / LATEST, {"step": int(step), "dir": name,
                                     "world_size": int(kept["world_size"]), "identity": identity})
    tmp.rename(out / CHECKPOINTS)
    return True


def run_branch(corpus_dir: str | Path, parent: str | Path, out: str | Path, stable: ScapeConfig,
               run: ScapeRun, model: ModelConfig, step: int, world_size: int, *, seed: int,
               corpus: str = "", simulated: bool = False) -> Path:
    """Train (or resume, or skip if finished) the branch at ``step`` of the stable run
    ``parent`` (trained with ``stable``, ``run``, ``model``, ``seed``, ``world_size``) into
    ``out``: under torchrun, or with the workers simulated in one process (``simulated``, as
    the parent was)."""
    from lmrepro.scape.train.trainer import RunTarget, run_identity

    out = Path(out)
    if (out / SUMMARY).exists():
        return out
    cfg = branch_settings(stable, step)
    target = RunTarget(corpus_dir=str(corpus_dir), out=str(out), seed=seed, corpus=corpus)
    identity = run_identity(cfg, run, model, target, world_size)
    if simulated:
        from lmrepro.scape.train.simulated import ENGINE, train_simulated

        seed_branch(parent, out, step, {**identity, "engine": ENGINE})
        return train_simulated(cfg, run, model, target, world_size)
    from lmrepro.scape.train.launch import launch_train_scape

    seed_branch(parent, out, step, identity)
    return launch_train_scape(corpus_dir, out, world_size, cfg, run, model, seed=seed,
                              corpus=corpus)
