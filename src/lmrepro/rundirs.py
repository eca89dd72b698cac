"""A stage's run directories, kept by the identity that made them.

A folder of runs (a suite's ``results/<stage>/runs``, a sweep's, one point of a length study)
stores the identity that made it (parameters and the prepared data's manifests) in
``identity.json``. :func:`prepare_runs_dir` keeps it when the identity is unchanged. When it
changed (another profile, an edited parameter) the folder is kept beside, under its identity,
as ``<name>.kept-<key>`` (``key``: :func:`identity_key`), and a folder kept earlier under the new
identity comes back into place: switching profile and back trains nothing again, and no run of
one profile is ever reused for another. A folder whose identity cannot be read is moved to
``<name>.stale-<UTC time>``. Nothing here deletes a run. Readers skip both kinds of folder
(:func:`set_aside`). A training stage's DVC products: :mod:`lmrepro.pipeline.stage_products`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from lmrepro.errors import check
from lmrepro.io import DamagedFileError, atomic_write_json, read_json
from lmrepro.results import SUMMARY
from lmrepro.runlock import WRITER_LOCK, check_no_other_writer

log = logging.getLogger(__name__)

IDENTITY = "identity.json"
#: how a folder of one seed's runs is named (:func:`seed_dir`, :func:`seed_of`)
SEED_PREFIX = "seed"
#: the name parts of folders set aside: kept under another identity, or of an unknown one
KEPT, STALE = ".kept-", ".stale-"


def identity_key(identity: Any) -> str:
    """A short, stable key of an identity: the first 16 hex digits of the sha256 of its
    canonical JSON."""
    text = json.dumps(identity, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def set_aside(path: str | Path) -> bool:
    """Whether ``path`` lies in a folder set aside by :func:`prepare_runs_dir`."""
    return any(KEPT in part or STALE in part for part in Path(path).parts)


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def _free_name(path: Path) -> Path:
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _set_aside(runs_dir: Path, identity: Any) -> None:
    """Move ``runs_dir`` beside itself: kept under its ``identity``, or stale when unknown."""
    if identity is not None:
        target = runs_dir.with_name(f"{runs_dir.name}{KEPT}{identity_key(identity)}")
        if not target.exists():
            runs_dir.rename(target)
            log.info("%s was made by another configuration or data: kept as %s (it comes back "
                     "when that configuration is run again)", runs_dir, target)
            return
    target = _free_name(runs_dir.with_name(f"{runs_dir.name}{STALE}{_utc_stamp()}"))
    runs_dir.rename(target)
    log.warning("%s was made by another or an unknown configuration: moved aside to %s",
                runs_dir, target)


def prepare_runs_dir(runs_dir: str | Path, identity: dict[str, Any]) -> Path:
    """Make ``runs_dir`` the folder of ``identity``'s runs (see the module docstring): kept when
    the same configuration and data made it; otherwise set aside under its own identity, and the
    folder kept earlier for ``identity`` (if any) brought back. Call it after every check of the
    configuration passed.

    DVC keeps run directories (``persist: true``) so that an interrupted stage resumes; this
    check is what makes that safe. Nothing is moved while any run below is being written by
    another process (:class:`~lmrepro.runlock.RunDirectoryBusy`); the caller holds the stage's
    own writer lock.
    """
    runs_dir = Path(runs_dir)
    marker = runs_dir / IDENTITY
    identity = json.loads(json.dumps(identity, sort_keys=True, default=str))
    if runs_dir.exists():
        check_no_other_writer(runs_dir)
    if runs_dir.exists() and any(p.name != WRITER_LOCK for p in runs_dir.iterdir()):
        have = _read_identity(marker) if marker.exists() else None
        if have == identity:
            return runs_dir
        _set_aside(runs_dir, have)
    kept = runs_dir.with_name(f"{runs_dir.name}{KEPT}{identity_key(identity)}")
    if runs_dir.is_dir() and not any(runs_dir.iterdir()):
        runs_dir.rmdir()
    if not runs_dir.exists() and kept.is_dir() and _read_identity(kept / IDENTITY) == identity:
        check_no_other_writer(kept)
        kept.rename(runs_dir)
        log.info("%s: the runs kept for this configuration are back in place", runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(marker, identity)
    return runs_dir


def seed_dir(seed: int) -> str:
    """The folder of the runs trained with ``seed``, the level above each run's own folder in
    every stage and study (:func:`run_path`)."""
    return f"{SEED_PREFIX}{seed}"


def is_seed_dir(folder: str) -> bool:
    """Whether ``folder`` is a :func:`seed_dir` name."""
    return folder.startswith(SEED_PREFIX) and folder.removeprefix(SEED_PREFIX).isdigit()


def seed_of(folder: str) -> int:
    """The seed a :func:`seed_dir` folder name holds (``seed3`` -> 3); anything else is refused
    by name."""
    check(is_seed_dir(folder), "seed folder", folder,
          f"must be {SEED_PREFIX}<N> (rundirs.seed_dir)")
    return int(folder.removeprefix(SEED_PREFIX))


def run_path(point: str | Path, seed: int, run: str) -> Path:
    """The one run-directory layout: a run's folder is ``<point>/seed<N>/<run>``, where
    ``<point>`` is a suite's ``runs/<corpus>`` or a study's ``<kind>/<size>/L<steps>``."""
    return Path(point) / seed_dir(seed) / run


def run_label(point: str, seed: int, run: str) -> str:
    """A run's label: its :func:`run_path` below the runs folder (``4x64/L3000/seed0/rgc``)."""
    return run_path(point, seed, run).as_posix()


def split_run_label(label: str) -> tuple[str, int, str]:
    """``(point, seed, run)`` of a run's label (:func:`run_label`). The run-first order in
    which the published RGC length studies keep their runs (``published/rgc_*``:
    ``.../L3000/rgc/seed0``) reads the same; anything else is refused by name."""
    parts = label.split("/")
    check(len(parts) >= 2 and (is_seed_dir(parts[-2]) or is_seed_dir(parts[-1])), "run label",
          label, f"must end in {SEED_PREFIX}<N>/<run> (rundirs.run_label)")
    seed, run = (parts[-2], parts[-1]) if is_seed_dir(parts[-2]) else (parts[-1], parts[-2])
    return "/".join(parts[:-2]), seed_of(seed), run


def seed_first(point: str | Path) -> int:
    """Move the run-first folders below ``point`` (``<run>/seed<N>/``, with the run's
    ``identity.json`` beside the seeds) to :func:`run_path`'s places, each with a copy of its
    identity, so the runs are read and reused as they are; how many moved. Folders set aside
    move the same way (``<run>.kept-<key>``); a place already taken keeps both where they are
    (logged). Call it under the stage's writer lock."""
    point, moved = Path(point), 0
    for old in sorted(p for p in point.iterdir() if p.is_dir()) if point.is_dir() else []:
        seeds = [d for d in old.iterdir() if d.is_dir() and is_seed_dir(d.name)]
        if is_seed_dir(old.name) or not seeds:
            continue
        check_no_other_writer(old)
        for seed in sorted(seeds):
            target = point / seed.name / old.name
            if target.exists():
                log.warning("%s: %s is taken, left where it is", seed, target)
                continue
            target.parent.mkdir(exist_ok=True)
            seed.rename(target)
            if (old / IDENTITY).is_file():
                shutil.copyfile(old / IDENTITY, target / IDENTITY)
            moved += 1
        if not any(d.is_dir() for d in old.iterdir()):
            shutil.rmtree(old)
    if moved:
        log.info("%s: %d run folders moved from <run>/seed<N> to seed<N>/<run>", point, moved)
    return moved


def _read_identity(marker: Path) -> Any:
    """The stored identity; a damaged or missing one is None (the folder goes stale)."""
    try:
        return read_json(marker)
    except (DamagedFileError, UnicodeDecodeError, ValueError, OSError):
        return None


def collect_runs(runs_dir: str | Path) -> dict[str, Path]:
    """Finished run directories at any depth under ``runs_dir`` (:func:`run_path`),
    labelled by their path below it, e.g. ``{"shakespeare/seed0/adamw": path}``, sorted; none
    from a folder set aside or a checkpoint."""
    runs_dir = Path(runs_dir)
    return {summary.parent.relative_to(runs_dir).as_posix(): summary.parent
            for summary in sorted(runs_dir.rglob(SUMMARY))
            if not set_aside(rel := summary.relative_to(runs_dir))
            and "checkpoints" not in rel.parts}


def restore_run(run_dir: str | Path, stage: str | Path, published_stage: str | Path) -> bool:
    """Put back the published run at ``run_dir``'s place below ``published_stage`` (a
    published study's stage folder: its runs' summaries and per-batch losses; the run-first
    order of :func:`split_run_label` found too) when ``run_dir`` (below ``stage``) has not
    finished; whether it copied. A finished run is left as it is, and so is the identity the
    stage wrote into ``run_dir``."""
    run_dir = Path(run_dir)
    if (run_dir / SUMMARY).exists():
        return False
    rel = run_dir.relative_to(stage)
    src = Path(published_stage) / rel
    if not src.is_dir() and is_seed_dir(rel.parent.name):
        src = Path(published_stage) / rel.parent.parent / rel.name / rel.parent.name
    check((src / SUMMARY).is_file(), "--restore-from", str(published_stage),
          f"must hold every run of the study; {src} has no {SUMMARY}")
    for old in run_dir.iterdir() if run_dir.exists() else []:
        if old.name != IDENTITY:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    shutil.copytree(src, run_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(IDENTITY))
    return True
