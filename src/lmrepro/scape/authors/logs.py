"""The SCAPE authors' Megatron-LM training logs as one tidy table.

The authors' public repository (``mz687/SCAPE_SC26``, ``slurm_scripts/vista/``) stores the
``.out`` logs of their runs on TACC Vista. A Megatron log is read line by line:

* the run's settings from its header: ``using world size: N`` (a new segment: a restart appends
  a new header to the same file), the argument block (``  name ...... value``), the optimizer's
  configuration line (``clip_grad=``), the dataset configuration (``data_parallel_size=``) and
  the resume point (``current_iteration from -1 to N``);
* one row per ``iteration N/ T | elapsed time per iteration (ms): ... | lm loss: ... | grad norm:
  ... |`` line (other text glued after the last ``|`` is ignored);
* ``validation loss at iteration N | lm loss value: ...`` attaches ``val_loss`` to row N;
* the SCAPE reducer's ``step=K density=D`` line gives the fraction sent at iteration ``K + 1``
  (it is printed while Megatron's counter still reads K, before the step that logs K + 1).

A file may be an *excerpt* of a long log: ``# lmrepro-excerpt repository=... commit=...
path=... total_chars=...`` names its source, and ``# page offset=N`` starts the lines read from
the page at character offset N (``page_offset`` of the rows, so the provenance of every row is
in the table); ``# page offset=N path=... commit=...`` is a page of another file of the same job
(Megatron writes the settings from rank 0 and the iteration lines from the last rank, and some
jobs' two streams landed in two files): its settings lines apply to the log, and the provenance
names that file. Where a header was not read, settings the run's file name states
(``d_0.1``, ``comp_start_step_2000``, ``d_warmup_steps_8000``, ``no_clip_grad``, the model size)
fill in; nothing else is guessed. :func:`load_vista_table` reads the committed table of the
authors' Vista logs (``data/authors_vista_logs.csv``, provenance beside it).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from lmrepro.errors import ParameterError, check

#: the table's columns (one row per logged iteration)
COLUMNS = ["repository", "commit", "path", "run", "segment", "model", "world_size", "method",
           "target_density", "clip_grad", "micro_batches", "start_iteration", "density",
           "iteration", "elapsed_ms", "lm_loss", "grad_norm", "val_loss", "page_offset"]
METHODS = ("adams", "adamw", "scape")
DATA_FILE = "authors_vista_logs.csv"
PROVENANCE_FILE = "authors_vista_logs.provenance.json"

_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)")
_VALIDATION = re.compile(r"validation loss at iteration\s+(\d+)\s*\|\s*lm loss value:\s*(\S+)")
_WORLD = re.compile(r"using world size:\s*(\d+)")
_ARG = re.compile(r"^\s+(\w+) \.{2,} ?(.*?)\s*$")
_REDUCER = re.compile(r"\bstep=(\d+) density=([0-9.eE+-]+)")
_RESUME = re.compile(r"current_iteration from -?\d+ to (\d+)")
_DATA_PARALLEL = re.compile(r"\bdata_parallel_size=(\d+)")
_CLIP = re.compile(r"\bclip_grad=([0-9.eE+-]+)")
_MICROBATCHES = re.compile(r"number of microbatches to constant (\d+)")
_EXCERPT = re.compile(r"^# lmrepro-excerpt\s+(.*)$")
_PAGE = re.compile(r"^# page offset=(\d+)(.*)$")
#: the row fields of an iteration line: (label in the log, column)
_FIELDS = (("elapsed time per iteration (ms)", "elapsed_ms"), ("lm loss", "lm_loss"),
           ("grad norm", "grad_norm"))
#: argument-block names kept as settings
_KEPT_ARGS = {"world_size", "data_parallel_size", "num_layers", "hidden_size", "micro_batch_size",
              "global_batch_size", "optimizer", "clip_grad", "use_topk_adams_reducer",
              "topk_adams_density", "topk_adams_density_start", "topk_adams_start_iter",
              "topk_adams_density_warmup_steps"}


@dataclass(frozen=True)
class LogSource:
    """Where a log comes from: ``repository`` (owner/name), ``commit`` (40 hex digits or
    empty when unknown) and ``path`` inside the repository."""

    repository: str
    commit: str
    path: str

    def __post_init__(self) -> None:
        check(re.fullmatch(r"[\w.-]+/[\w.-]+", self.repository) is not None, "repository",
              self.repository, "must be owner/name")
        check(re.fullmatch(r"([0-9a-f]{40})?", self.commit) is not None, "commit", self.commit,
              "must be 40 lowercase hex digits or empty")
        check(bool(self.path), "path", self.path, "must be a non-empty path")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_fields(rest: str) -> dict[str, float]:
    """The ``name: value`` fields of an iteration line after its ``iteration N/ T |``; a field
    the line does not hold (a page cut it off) is absent."""
    out: dict[str, float] = {}
    for part in rest.split("|"):
        name, sep, value = part.partition(":")
        if not sep:
            continue
        for label, column in _FIELDS:
            if name.strip() == label:
                out[column] = _number(value.strip().split()[0]) if value.strip() else math.nan
    return out


def settings_from_path(path: str) -> dict[str, Any]:
    """The settings a run's file name states (the authors name runs after their flags)."""
    out: dict[str, Any] = {}
    name = Path(path).name
    for key, pattern, cast in (("topk_adams_density", r"_d_([0-9.]+?)_", float),
                               ("topk_adams_start_iter", r"comp_start_step_(\d+)", int),
                               ("topk_adams_density_warmup_steps", r"d_warmup_steps_(\d+)", int)):
        if m := re.search(pattern, name):
            out[key] = cast(m.group(1))
    if "no_clip_grad" in name:
        out["clip_grad"] = 0.0
    if "/reducers/" in f"/{path}":
        out["use_topk_adams_reducer"] = True
    elif m := re.search(r"baseline/(Adam[SW])/", path):
        out["optimizer"] = m.group(1).lower()
    return out


def model_name(layers: int | None, hidden: int | None, path: str) -> str:
    """The paper model with ``layers`` x ``hidden`` (:data:`lmrepro.scape.steptime.paper.MODELS`),
    else the one whose size the path names (``500M``), else ``""``."""
    from lmrepro.scape.steptime.paper import MODELS

    for m in MODELS:
        if (m.layers, m.hidden) == (layers, hidden):
            return m.name
    for m in MODELS:
        size = m.name.rsplit("-", 1)[-1]
        family = "gpt" if m.name.startswith("GPT") else "llama"
        if re.search(rf"(?<![0-9.]){re.escape(size)}", path) and family in path.lower():
            return m.name
    return ""


@dataclass
class _Segment:
    """The settings and rows of one start of a run (a restart opens the next one)."""

    index: int
    settings: dict[str, Any]
    start: int | None = None
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    reducer: list[tuple[int, float]] = field(default_factory=list)


def _arg_value(name: str, text: str) -> Any:
    if name in ("optimizer",):
        return text.strip()
    if name == "use_topk_adams_reducer":
        return text.strip() == "True"
    value = _number(text.strip())
    return int(value) if name not in ("clip_grad", "topk_adams_density",
                                      "topk_adams_density_start") and value.is_integer() else value


class _Parser:
    """Line-by-line state: the current segment, page and excerpt source."""

    def __init__(self, source: LogSource | None) -> None:
        self.source = source
        self.meta: dict[str, str] = {}
        self.page: float = math.nan
        self.segments = [_Segment(0, {})]

    @property
    def seg(self) -> _Segment:
        return self.segments[-1]

    def feed(self, line: str) -> None:
        if m := _EXCERPT.match(line):
            self.meta = _key_values(m.group(1))
        elif m := _PAGE.match(line):
            self.page = float(m.group(1))
        elif m := _WORLD.search(line):
            if self.seg.rows or self.seg.start is not None:
                self.segments.append(_Segment(len(self.segments), dict(self.seg.settings)))
            self.seg.settings["world_size"] = int(m.group(1))
        elif m := _ITERATION.search(line):
            it = int(m.group(1))
            row = self.seg.rows.setdefault(it, {"page_offset": self.page})
            row.update(parse_fields(m.group(3)))
        else:
            self._settings(line)

    def _settings(self, line: str) -> None:
        s = self.seg.settings
        if m := _VALIDATION.search(line):
            row = self.seg.rows.setdefault(int(m.group(1)), {"page_offset": self.page})
            row["val_loss"] = _number(m.group(2))
        elif m := _REDUCER.search(line):
            self.seg.reducer.append((int(m.group(1)) + 1, float(m.group(2))))
        elif m := _RESUME.search(line):
            self.seg.start = int(m.group(1))
        elif m := _ARG.match(line):
            if m.group(1) in _KEPT_ARGS:
                s[m.group(1)] = _arg_value(m.group(1), m.group(2))
        else:
            for pattern, key in ((_DATA_PARALLEL, "data_parallel_size"), (_CLIP, "clip_grad"),
                                 (_MICROBATCHES, "micro_batches")):
                if (m := pattern.search(line)) and key not in s:
                    s[key] = _number(m.group(1))


def _method(s: dict[str, Any], reducer_seen: bool) -> str:
    if s.get("use_topk_adams_reducer") or reducer_seen:
        return "scape"
    return str(s.get("optimizer", "")) if s.get("optimizer") in METHODS else ""


def scheduled_density(iteration: int, s: dict[str, Any]) -> float:
    """The fraction sent at ``iteration`` by the reducer's schedule (``density_start`` until
    ``start_iter``, linear to ``density`` over ``warmup_steps``, then ``density``): the step
    that logs iteration ``i`` is the reducer's step ``i - 1``; nan when a setting is missing."""
    keys = ("topk_adams_density", "topk_adams_start_iter", "topk_adams_density_warmup_steps")
    if any(k not in s for k in keys):
        return math.nan
    target, start, warm = (s[k] for k in keys)
    first = s.get("topk_adams_density_start", 1.0)
    step = iteration - 1
    if step < start:
        return float(first)
    if warm <= 0 or step >= start + warm:
        return float(target)
    return float(first + (target - first) * (step - start) / warm)


def _segment_rows(seg: _Segment, source: LogSource) -> list[dict[str, Any]]:
    s = {**settings_from_path(source.path), **seg.settings}
    method = _method(s, bool(seg.reducer))
    world = s.get("world_size", s.get("data_parallel_size", math.nan))
    micro = s.get("micro_batches", math.nan)
    if math.isnan(micro) and {"global_batch_size", "micro_batch_size"} <= s.keys() \
            and not math.isnan(world):
        micro = s["global_batch_size"] / (s["micro_batch_size"] * world)
    logged = sorted(seg.reducer)
    base = {"repository": source.repository, "commit": source.commit, "path": source.path,
            "run": Path(source.path).stem, "segment": seg.index,
            "model": model_name(s.get("num_layers"), s.get("hidden_size"), source.path),
            "world_size": world, "method": method,
            "target_density": s.get("topk_adams_density", 1.0 if method != "scape" else math.nan),
            "clip_grad": s.get("clip_grad", math.nan), "micro_batches": micro,
            "start_iteration": math.nan if seg.start is None else seg.start}
    rows = []
    for it in sorted(seg.rows):
        if method != "scape":
            density = 1.0
        else:   # the last reducer line at or before this iteration, else the schedule
            known = [d for i, d in logged if i <= it]
            density = known[-1] if known else scheduled_density(it, s)
        rows.append({**base, "density": density, "iteration": it, **seg.rows[it]})
    return rows


def parse_log(lines: Iterable[str], source: LogSource | None = None) -> pd.DataFrame:
    """The table (:data:`COLUMNS`) of one log's ``lines``; ``source`` names the log, else the
    excerpt header (``# lmrepro-excerpt repository=... commit=... path=...``) must."""
    p = _Parser(source)
    for line in lines:
        p.feed(line.rstrip("\n"))
    if source is None:
        if not {"repository", "path"} <= p.meta.keys():
            raise ParameterError("source", None, "must be given, or the log must start with "
                                 "'# lmrepro-excerpt repository=... commit=... path=...'")
        source = LogSource(p.meta["repository"], p.meta.get("commit", ""), p.meta["path"])
    rows = [r for seg in p.segments for r in _segment_rows(seg, source)]
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df:
            df[c] = math.nan
    return df[COLUMNS]


def extract_file(path: str | Path, source: LogSource | None = None) -> pd.DataFrame:
    """:func:`parse_log` of a file; bad input: one-line errors naming the file."""
    p = Path(path)
    check(p.is_file(), "log", str(p), "must be an existing file")
    with p.open(encoding="utf-8", errors="replace") as f:
        df = parse_log(f, source)
    check(not df.empty, "log", str(p), "must hold at least one Megatron 'iteration N/ T |' line")
    return df


def extract_dir(root: str | Path, pattern: str = "*.out") -> pd.DataFrame:
    """One table of every log under ``root`` matching ``pattern`` (excerpts name their own
    source; a plain log is named by its path under ``root``, repository ``local/logs``)."""
    r = Path(root)
    check(r.is_dir(), "logs", str(r), "must be an existing directory")
    files = sorted(r.rglob(pattern))
    check(bool(files), "logs", str(r), f"must hold files matching {pattern!r}")
    frames = []
    for f in files:
        with f.open(encoding="utf-8", errors="replace") as fh:
            first = fh.readline()
        source = None if _EXCERPT.match(first) else LogSource(
            "local/logs", "", f.relative_to(r).as_posix())
        frames.append(extract_file(f, source))
    return pd.concat(frames, ignore_index=True).sort_values(
        ["path", "segment", "iteration"], kind="stable").reset_index(drop=True)


def _key_values(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def excerpt_pages(path: str | Path) -> dict[str, Any]:
    """An excerpt's source (its ``# lmrepro-excerpt`` header) and the pages read: per
    ``# page offset=N``, the first and last iteration line under it (None for a page read for
    its header lines only) and how many iteration lines it holds."""
    meta: dict[str, str] = {}
    pages: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if m := _EXCERPT.match(line):
                meta = _key_values(m.group(1))
            elif m := _PAGE.match(line):
                pages.append({"offset": int(m.group(1)), "its": [],
                              **_key_values(m.group(2))})
            elif pages and (m := _ITERATION.search(line)):
                pages[-1]["its"].append(int(m.group(1)))
    check("path" in meta, "excerpt", str(path), "must start with '# lmrepro-excerpt ... path=...'")
    return {**meta, "pages": [{"offset": pg["offset"],
                               "first_iteration": min(pg["its"]) if pg["its"] else None,
                               "last_iteration": max(pg["its"]) if pg["its"] else None,
                               "iteration_lines": len(pg["its"]),
                               **{k: pg[k] for k in ("path", "commit") if k in pg}}
                              for pg in pages]}


def write_table(root: str | Path, out_csv: str | Path, provenance_json: str | Path | None = None,
                notes: dict[str, Any] | None = None, pattern: str = "*.out") -> pd.DataFrame:
    """Extract every log under ``root`` into ``out_csv``; with ``provenance_json``, write beside
    it the pages each excerpt was read from (:func:`excerpt_pages`) and ``notes``."""
    from lmrepro.io import atomic_write_json, atomic_write_text

    df = extract_dir(root, pattern)
    atomic_write_text(out_csv, df.to_csv(index=False, float_format="%.7g"))
    if provenance_json is not None:
        files = [excerpt_pages(f) for f in sorted(Path(root).rglob(pattern))
                 if _EXCERPT.match(f.read_text(encoding="utf-8").split("\n", 1)[0])]
        atomic_write_json(provenance_json, {**(notes or {}), "table": Path(out_csv).name,
                                            "rows": len(df), "files": files})
    return df


def merge_table(root: str | Path, csv: str | Path, provenance_json: str | Path,
                not_read: list[dict[str, Any]] | None = None, pattern: str = "*.out"
                ) -> pd.DataFrame:
    """Add the excerpts under ``root`` to an existing table and its provenance: the rows and
    provenance entries of a log read again are replaced, a log now read leaves ``not_read``,
    and ``not_read`` (``path``, ``why``) entries are added or replace those of the same path."""
    from lmrepro.io import atomic_write_json, atomic_write_text

    check(Path(csv).is_file(), "table", str(csv), "must be an existing CSV to merge into")
    check(Path(provenance_json).is_file(), "provenance", str(provenance_json),
          "must be the existing table's provenance JSON")
    new = extract_dir(root, pattern)
    old = pd.read_csv(csv, dtype={"commit": str})
    df = pd.concat([old[~old.path.isin(set(new.path))], new], ignore_index=True)
    df = df.sort_values(["path", "segment", "iteration"], kind="stable").reset_index(drop=True)
    atomic_write_text(csv, df[COLUMNS].to_csv(index=False, float_format="%.7g"))
    prov = json.loads(Path(provenance_json).read_text(encoding="utf-8"))
    files = [excerpt_pages(f) for f in sorted(Path(root).rglob(pattern))
             if _EXCERPT.match(f.read_text(encoding="utf-8").split("\n", 1)[0])]
    read = {f["path"] for f in files} | {pg["path"] for f in files for pg in f["pages"]
                                         if "path" in pg}
    prov["files"] = [f for f in prov.get("files", []) if f["path"] not in read] + files
    extra = {e["path"]: e for e in not_read or []}
    prov["not_read"] = [e for e in prov.get("not_read", [])
                        if e["path"] not in read and e["path"] not in extra] + list(extra.values())
    prov["rows"] = len(df)
    atomic_write_json(provenance_json, prov)
    return df


def load_vista_table() -> pd.DataFrame:
    """The committed table of the authors' Vista logs (found through the package)."""
    with resources.as_file(resources.files("lmrepro.scape") / "data" / DATA_FILE) as f:
        return pd.read_csv(f, dtype={"commit": str})


def vista_provenance() -> dict[str, Any]:
    """The committed table's provenance: the pages read from each log."""
    text = (resources.files("lmrepro.scape") / "data" / PROVENANCE_FILE).read_text("utf-8")
    return json.loads(text)


def run(args: argparse.Namespace) -> int:
    if args.merge:
        check(args.provenance is not None, "--provenance", None,
              "must name the table's provenance JSON with --merge")
        not_read = json.loads(Path(args.not_read).read_text("utf-8")) if args.not_read else None
        df = merge_table(args.logs, args.out, args.provenance, not_read)
    else:
        df = write_table(args.logs, args.out, args.provenance)
    runs = df.groupby(["path", "segment"]).size()
    print(f"{args.out}: {len(df)} rows from {df.path.nunique()} logs ({len(runs)} segments)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``authors-logs`` to the ``lmrepro`` command."""
    p = subparsers.add_parser("authors-logs", help="Megatron training logs -> one tidy CSV",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("logs", help="directory of Megatron .out logs (or lmrepro excerpts)")
    p.add_argument("--out", required=True, help="CSV to write")
    p.add_argument("--provenance", default=None, help="JSON of the excerpt pages read")
    p.add_argument("--merge", action="store_true",
                   help="add the logs to the existing --out table and --provenance (a log read "
                        "again replaces its rows)")
    p.add_argument("--not-read", default=None,
                   help="with --merge: JSON list of {path, why} for logs named but not read")
    p.set_defaults(func=run)
