"""``lmrepro train-rgc``: one RGC (sync/async) or global-backprop run from the command line.

    lmrepro train-rgc --executor async --corpus-dir data/prepared/shakespeare \\
        --corpus shakespeare --out results/rgc/rgc-async --n-layers 8 --n-stages 4 \\
        --threads-per-stage 1 1 1 1 --steps 300

Every :class:`lmrepro.rgc.RGCConfig` field is an option (``--n-layers``, ``--horizon``, ...);
``--config-json`` gives them as one JSON object (options given explicitly override it).
Data: ``--corpus-dir`` (a prepared corpus: its ``train`` and ``val`` splits) or ``--train-file``
and ``--val-file`` (raw byte files). Prints the run's summary as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path

import numpy as np

from lmrepro.errors import check

_ABSENT = object()


def _field_type(f: dataclasses.Field) -> tuple[type, str | None]:
    from lmrepro.rgc.config import RGCConfig

    hints = typing.get_type_hints(RGCConfig)
    t = hints[f.name]
    args = [a for a in typing.get_args(t) if a is not type(None)]
    if f.name == "threads_per_stage":
        return int, "+"
    if args:
        t = args[0]
    return t, None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lmrepro.rgc.config import EXECUTORS, RGCConfig

    p.add_argument("--executor", default="async", choices=EXECUTORS)
    p.add_argument("--out", required=True, help="run directory (results layout; resumes)")
    p.add_argument("--corpus", default="", help="corpus name recorded in summary.json")
    p.add_argument("--name", default=None, help="run name (default rgc-<executor> / backprop)")
    p.add_argument("--corpus-dir", default=None, help="prepared corpus with train/val splits")
    p.add_argument("--train-file", default=None, help="raw training bytes")
    p.add_argument("--val-file", default=None, help="raw validation bytes")
    p.add_argument("--config-json", default=None, help="RGCConfig fields as a JSON object")
    for f in dataclasses.fields(RGCConfig):
        t, nargs = _field_type(f)
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=t, nargs=nargs,
                       default=_ABSENT, help=f"RGCConfig.{f.name} (default {f.default!r})")


def config_from_args(args: argparse.Namespace):  # -> RGCConfig
    from lmrepro.rgc.config import RGCConfig

    fields: dict = {}
    if args.config_json:
        try:
            fields.update(json.loads(args.config_json))
        except json.JSONDecodeError as err:
            check(False, "--config-json", args.config_json, f"must be a JSON object ({err})")
    for f in dataclasses.fields(RGCConfig):
        v = getattr(args, f.name, _ABSENT)
        if v is not _ABSENT:
            fields[f.name] = v
    return RGCConfig.from_dict(fields)


def load_data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    if args.corpus_dir:
        from lmrepro.data.prepare import load_split

        return np.asarray(load_split(args.corpus_dir, "train")), \
            np.asarray(load_split(args.corpus_dir, "val"))
    check(bool(args.train_file and args.val_file), "--train-file/--val-file",
          [args.train_file, args.val_file], "give both, or --corpus-dir")
    out = []
    for name, path in (("--train-file", args.train_file), ("--val-file", args.val_file)):
        check(Path(path).is_file(), name, path, "must be an existing file of raw bytes")
        out.append(np.fromfile(path, dtype=np.uint8))
    return out[0], out[1]


def run(args: argparse.Namespace) -> int:
    from lmrepro.rgc.runner import train

    cfg = config_from_args(args)
    train_data, val_data = load_data(args)
    result = train(cfg, args.executor, train_data, val_data, args.out, args.corpus or "unknown",
                   args.name)
    summary = {k: v for k, v in result.summary.items() if k != "config"}
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``train-rgc`` to the project's CLI (called by :mod:`lmrepro.cli`)."""
    p = subparsers.add_parser("train-rgc", help="RGC (sync/async) or global-backprop run",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lmrepro-rgc")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
