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
    """The folder of a stage's runs trained with ``seed``: ``runs/<corpus>/seed<N>/<run>`` (a
    suite runs once per seed; the analysis pairs runs by the seed in their summaries)."""
    return f"{SEED_PREFIX}{seed}"


def seed_of(folder: str) -> int:
    """The seed a :func:`seed_dir` folder name holds (``seed3`` -> 3); anything else is refused
    by name."""
    digits = folder.removeprefix(SEED_PREFIX)
    check(folder.startswith(SEED_PREFIX) and digits.isdigit(), "seed folder", folder,
          f"must be {SEED_PREFIX}<N> (rundirs.seed_dir)")
    return int(digits)


def _read_identity(marker: Path) -> Any:
    """The stored identity; a damaged or missing one is None (the folder goes stale)."""
    try:
        return read_json(marker)
    except (DamagedFileError, UnicodeDecodeError, ValueError, OSError):
        return None


def collect_runs(runs_dir: str | Path) -> dict[str, Path]:
    """Finished run directories at any depth under ``runs_dir`` (``<corpus>/seed<N>/<run>``),
    labelled by their path below it, e.g. ``{"shakespeare/seed0/adamw": path}``, sorted; none
    from a folder set aside."""
    runs_dir = Path(runs_dir)
    return {summary.parent.relative_to(runs_dir).as_posix(): summary.parent
            for summary in sorted(runs_dir.rglob(SUMMARY))
            if not set_aside(summary.relative_to(runs_dir))}


def restore_run(run_dir: str | Path, stage: str | Path, published_stage: str | Path) -> bool:
    """Put back the published run at ``run_dir``'s place below ``published_stage`` (a
    published study's stage folder: its runs' summaries and per-batch losses) when ``run_dir``
    (below ``stage``) has not finished; whether it copied. A finished run is left as it is."""
    run_dir = Path(run_dir)
    if (run_dir / SUMMARY).exists():
        return False
    src = Path(published_stage) / run_dir.relative_to(stage)
    check((src / SUMMARY).is_file(), "--restore-from", str(published_stage),
          f"must hold every run of the study; {src} has no {SUMMARY}")
    if run_dir.exists():
        shutil.rmtree(run_dir)
    shutil.copytree(src, run_dir)
    return True
