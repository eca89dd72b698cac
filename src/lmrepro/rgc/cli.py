"""``lmrepro train-rgc``: one RGC (sync/async) or global-backprop run from the command line.

    lmrepro train-rgc --executor async --corpus-dir data/prepared/shakespeare \\
        --corpus shakespeare --out results/rgc/rgc-async --model-n-layers 8 --n-stages 4 \\
        --stages-per-worker 2 2 --threads 1 1 --steps 300

Every :class:`lmrepro.rgc.RGCConfig` field is an option (``--model-n-layers``, ``--horizon``,
...);
``--config-json`` gives them as one JSON object (options given explicitly override it).
Data: ``--corpus-dir`` (a prepared corpus: its ``train`` and ``val`` splits) or ``--train-file``
and ``--val-file`` (raw byte files). Prints the run's summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lmrepro.config import add_arguments as add_config_arguments
from lmrepro.config import from_arguments
from lmrepro.errors import ParameterError, check


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``train-rgc`` flags: the run's location and one per :class:`RGCConfig` field."""
    from lmrepro.rgc.config import EXECUTORS, RGCConfig

    p.add_argument("--executor", default="async", choices=EXECUTORS)
    p.add_argument("--out", required=True, help="run directory (results layout; resumes)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and batch order")
    p.add_argument("--corpus", default="", help="corpus name recorded in summary.json")
    p.add_argument("--name", default=None, help="run name (default rgc-<executor> / backprop)")
    p.add_argument("--corpus-dir", default=None, help="prepared corpus with train/val splits")
    p.add_argument("--train-file", default=None, help="raw training bytes")
    p.add_argument("--val-file", default=None, help="raw validation bytes")
    p.add_argument("--config-json", default=None, help="RGCConfig fields as a JSON object "
                   "(flags given explicitly override it)")
    add_config_arguments(p, RGCConfig)


def config_from_args(args: argparse.Namespace):  # -> RGCConfig
    from lmrepro.rgc.config import RGCConfig

    base: dict = {}
    if args.config_json:
        try:
            base = json.loads(args.config_json)
        except json.JSONDecodeError as err:
            raise ParameterError("--config-json", args.config_json,
                                 f"must be a JSON object ({err})") from None
        check(isinstance(base, dict), "--config-json", args.config_json,
              "must be a JSON object")
    return from_arguments(RGCConfig, args, base)


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
    from lmrepro.rgc.core.run_memory import mark_fresh_process
    from lmrepro.rgc.executors.runner import train

    mark_fresh_process()          # one run per invocation: this process is its tree's root
    cfg = config_from_args(args)
    train_data, val_data = load_data(args)
    result = train(cfg, args.executor, train_data, val_data, args.out, args.corpus or "unknown",
                   args.name, seed=args.seed)
    summary = {k: v for k, v in result.summary.items() if k != "config"}
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def run_scaling(args: argparse.Namespace) -> int:
    from lmrepro.errors import check
    from lmrepro.pipeline.params import load_params
    from lmrepro.rgc.study.scaling import run_study

    params = load_params(args.params, args.profile)
    check(params.rgc.scaling is not None, "rgc.scaling", None,
          f"must be set in the profile to run the study (profile {params.profile!r} has none; "
          "try --profile rgc_scaling)")
    dirs = run_study(params.rgc, params.data.prepared_dir, args.out, args.restore_from)
    print(f"RGC training-length study: {len(dirs)} runs finished under {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``train-rgc`` and ``rgc-scaling`` to the project's CLI (called by
    :mod:`lmrepro.cli`)."""
    p = subparsers.add_parser("train-rgc", help="RGC (sync/async) or global-backprop run",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)
    p = subparsers.add_parser("rgc-scaling", help="run or resume the training-length study of "
                              "rgc.scaling (lmrepro.rgc.study.scaling)")
    p.add_argument("--params", default="params.yaml", help="parameter file")
    p.add_argument("--profile", default=None, help="profile in params.yaml (e.g. rgc_scaling)")
    p.add_argument("--out", default="results/rgc_scaling", help="the study's stage directory")
    p.add_argument("--restore-from", default=None, metavar="DIR",
                   help="put the runs back from a published study instead of training them "
                   "(e.g. published/rgc_scaling/results/rgc_scaling; docs/rgc.md)")
    p.set_defaults(func=run_scaling)


def main(argv: list[str] | None = None) -> int:
    from lmrepro.entry import ArgumentParser

    parser = ArgumentParser(prog="lmrepro-rgc")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
