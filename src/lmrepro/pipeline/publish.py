"""Publish a finished run: its small products under ``published/<profile>/``, its page and the
README's verdicts generated from them.

:func:`publish` copies what a reader needs to check a run's figures (never a checkpoint or a
model): the resolved parameters, each stage's DVC metrics (``metrics/``, the headline metrics
``dvc metrics diff`` compares) and plot data, every analysis product (``analysis.json``, the
tables, the figures, the claims), each run's ``summary.json`` and per-batch
``eval_losses.json`` (enough to recompute every statistic), the rendered reports with the index
and its provenance, and the run's ``dvc.lock`` (which must be this run's: :func:`check_lock`).
It refuses an unfinished run (no claims, no index, no lock) and any file over
:data:`MAX_FILE_BYTES`, writes ``MANIFEST.json`` (sha256 and size of every file) and replaces
the previous copy only once the new one is complete. It records the run's timed pairings in
the timing history beside the published profiles (``published/timing_history.json``:
:func:`lmrepro.pipeline.timing_history.record_profile`; republishing replaces the entry).
Then it writes the run's page,
``published/<profile>/README.md``, and the README's verdicts block
(:mod:`lmrepro.pipeline.pages`); a README that still holds a profile's own markers
(``<!-- lmrepro:<profile>:begin ... -->``, ``results`` for the reference run) gets that
section too.

The sections themselves (the reference run's results, a study's section, their markers) are
written by :mod:`lmrepro.pipeline.sections`. Tests check that the pages are what the published
files give (``tests/test_publish.py``).
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from pathlib import Path
from typing import Any

from lmrepro.errors import ParameterError, check
from lmrepro.io import (
    TMP_SUFFIX,
    atomic_write_json,
    os_errors_as,
    read_json,
    replace_dir,
    restore_previous_dir,
    sha256_file,
)
from lmrepro.lifetime import fault_point, scratch_dir, stale_scratch
from lmrepro.pipeline.registry import reports
from lmrepro.pipeline.sections import BEGIN, update_profile_section, update_readme
from lmrepro.rundirs import set_aside

REFERENCE = "reference"
MAX_FILE_BYTES = 8 << 20
MANIFEST = "MANIFEST.json"
#: the scratch folders of a publish beside its destination (lmrepro-publish-<pid>-...tmp)
SCRATCH_TAG = "publish"
#: the folders of a stage that hold run directories (a suite's or a study's)
RUN_FOLDERS = ("runs", "sweep", "sweep-edge", "ablations")
#: what is published, as glob patterns relative to the project root
PATTERNS = (
    "results/params.json",
    "results/*/metrics.json", "results/*/loss_curve.csv", "results/*/bytes_per_step.csv",
    "results/analysis/*.json", "results/analysis/*.csv", "results/analysis/*.png",
    "results/analysis/*/*.json", "results/analysis/*/*.csv", "results/analysis/*/*.png",
    "results/analysis/*/readme_section.md",
    # every run folder's summary and per-batch losses (what lmrepro.pipeline.runs.load_run
    # reads), so the analyses can be run again from a publication
    *(f"results/*/{kind}/**/{name}" for kind in RUN_FOLDERS
      for name in ("summary.json", "eval_losses.json", "eval_losses_test.json")),
    "results/*/sweep/sweep.json", "results/*/sweep/edge_check.json", "results/*/plan.json",
    # each runs folder's identity: a published run put back under results/ is then resumed
    # and reused as it is (lmrepro.rundirs.prepare_runs_dir), not set aside and retrained
    *(f"results/*/{kind}/**/identity.json" for kind in RUN_FOLDERS),
    "reports/*.html", "reports/provenance.json",
    "metrics/*/*.json", "dvc.lock",
)
#: a run is finished when these exist
REQUIRED = ("results/params.json", "results/analysis/claims.csv", "reports/index.html",
            "reports/provenance.json", "dvc.lock")
#: the products of the run whose hashes its ``dvc.lock`` must hold (the first and last stage)
LOCKED = ("results/params.json", "reports/index.html")


def published_files(root: str | os.PathLike) -> list[Path]:
    """The files of a finished run under ``root`` that :func:`publish` copies (:data:`PATTERNS`
    and the wings' own, ``Report.published``; relative paths,
    sorted; nothing under a ``checkpoints`` folder or a runs folder set aside:
    :func:`lmrepro.rundirs.set_aside`)."""
    root = Path(root)
    found: set[Path] = set()
    for pattern in (*PATTERNS, *(p for report in reports() for p in report.published)):
        for path in root.glob(pattern):
            rel = path.relative_to(root)
            if path.is_file() and "checkpoints" not in rel.parts and not set_aside(rel):
                found.add(rel)
    return sorted(found)


def publish(root: str | os.PathLike = ".", dest: str | os.PathLike | None = None, *,
            readme: str | os.PathLike | None = "README.md") -> Path:
    """Copy the finished run of ``root`` to ``dest`` (default ``root/published/<profile>``);
    when the profile is ``reference``, regenerate the README's "Results" section. Returns the
    destination."""
    root = Path(root)
    missing = [r for r in REQUIRED if not (root / r).is_file()]
    check(not missing, "run", str(root.resolve()),
          f"must be a finished run: {missing} missing (run `dvc repro` to the end first)")
    check_lock(root)
    profile = str(read_json(root / "results/params.json").get("profile", "default"))
    dest = Path(dest) if dest is not None else root / "published" / profile
    files = published_files(root)
    large = [(str(f), (root / f).stat().st_size) for f in files
             if (root / f).stat().st_size > MAX_FILE_BYTES]
    if large:
        raise ParameterError("published file", large[0][0],
                             f"must be at most {MAX_FILE_BYTES >> 20} MiB to publish "
                             f"({large[0][1]} bytes): only small products are published")
    from lmrepro.pipeline import pages

    dest.parent.mkdir(parents=True, exist_ok=True)
    # a publish killed between its two renames (where the system cannot swap folders in one
    # step) left the previous copy in its scratch folder: put back before that is swept
    restore_previous_dir(dest, stale_scratch(SCRATCH_TAG, dest.parent))
    remove_legacy_copies(dest)
    # the new copy is built in a scratch folder beside the destination (one rename away, on
    # the same file system), named so git and DVC ignore it and removed by the next publish
    # when this one is killed
    with os_errors_as(dest), scratch_dir(SCRATCH_TAG, dest.parent, suffix=TMP_SUFFIX) as scratch:
        tmp = scratch / dest.name
        _write_copy(root, tmp, files, profile, dest)
        pages.write_page(tmp)           # in the copy: a publication is never without its page
        replace_dir(tmp, dest)          # the previous copy, now in scratch, goes with it
        fault_point("publish-replaced")
    from lmrepro.pipeline.timing_history import HISTORY_NAME, record_profile

    record_profile(dest, dest.parent / HISTORY_NAME)
    if readme is not None:
        readme_path = Path(readme) if Path(readme).is_absolute() else root / readme
        pages.update_verdicts(readme_path, dest.parent)
        # links as the README's reader follows them: from the README's folder
        link_base = os.path.relpath(dest.resolve(), readme_path.parent.resolve())
        text = readme_path.read_text(encoding="utf-8") if readme_path.is_file() else ""
        if profile == REFERENCE and BEGIN in text:
            update_readme(readme_path, dest, link_base=link_base)
        elif profile != REFERENCE:
            update_profile_section(readme_path, dest, profile, link_base)
    return dest


def remove_legacy_copies(dest: Path) -> list[Path]:
    """Remove what a publish killed before its scratch folders were named for git to ignore
    left beside ``dest``: ``.<profile>.XXXXXXXX/`` (a half copy) and ``.<profile>.old/`` (the
    previous copy, put back first when ``dest`` is missing). Returns the folders removed."""
    old = dest.with_name(f".{dest.name}.old")
    if not dest.exists() and old.is_dir():
        old.rename(dest)
    removed = [d for d in dest.parent.glob(f".{dest.name}.*") if d.is_dir()
               and (d == old or len(d.name) == len(dest.name) + 10)]   # mkdtemp's 8 letters
    for d in removed:
        shutil.rmtree(d)
    return removed


def _write_copy(root: Path, tmp: Path, files: list[Path], profile: str, dest: Path) -> None:
    """Copy ``files`` of ``root`` to the new folder ``tmp`` (the umask's mode) with their
    ``MANIFEST.json``; ``dest``: the publication it will replace (for the runs' origins)."""
    tmp.mkdir()
    for i, rel in enumerate(files):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, tmp / rel)
        fault_point(f"publish-copied@{i}")
    prov = read_json(root / "reports/provenance.json")
    checksums = {str(rel): {"sha256": sha256_file(tmp / rel),
                            "bytes": (tmp / rel).stat().st_size} for rel in files}
    atomic_write_json(tmp / MANIFEST, {
        "format": "lmrepro.published/1", "profile": profile,
        "published_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "commit": (prov.get("git") or {}).get("commit"),
        "dirty": (prov.get("git") or {}).get("dirty"), "files": checksums,
        "run_origins": run_origins(checksums, prov, dest)})


def run_origins(checksums: dict[str, dict[str, Any]], prov: dict[str, Any], dest: Path
                ) -> dict[str, dict[str, str]]:
    """Where each run summary in ``checksums`` was trained: one byte-identical to the summary
    the publication at ``dest`` held keeps that publication's origin (the stage reused the run);
    every other is this run's (``prov``: its provenance). ``{path: {"commit", "machine"}}``."""
    from lmrepro.pipeline.pages import provenance_origin
    from lmrepro.results import SUMMARY

    here = provenance_origin(prov)
    old = read_json(dest / MANIFEST) if (dest / MANIFEST).is_file() else {}
    old_files, old_origins = old.get("files") or {}, old.get("run_origins") or {}
    before = provenance_origin(read_json(dest / "reports/provenance.json")
                    if (dest / "reports/provenance.json").is_file() else {"git": old})
    return {rel: (old_origins.get(rel, before)
                  if (old_files.get(rel) or {}).get("sha256") == c["sha256"] else here)
            for rel, c in checksums.items() if Path(rel).name == SUMMARY}


def check_lock(root: str | os.PathLike) -> None:
    """The run's ``dvc.lock`` must be this run's: the hashes it records for :data:`LOCKED` are
    those of the files (a lock left by another run, or by an interrupted one, is refused)."""
    import hashlib

    import yaml

    root = Path(root)
    lock = yaml.safe_load((root / "dvc.lock").read_text(encoding="utf-8")) or {}
    recorded = {o["path"]: o.get("md5") for stage in (lock.get("stages") or {}).values()
                for o in stage.get("outs") or []}
    for rel in LOCKED:
        actual = hashlib.md5((root / rel).read_bytes()).hexdigest()  # noqa: S324 - DVC's hash
        check(recorded.get(rel) == actual, "dvc.lock", str(root / "dvc.lock"),
              f"must be the lock of this run: it records {rel} as {recorded.get(rel)}, the file "
              f"is {actual} (run `dvc repro` to the end, then publish)")
