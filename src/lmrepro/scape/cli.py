"""The SCAPE wing's subcommands of the ``lmrepro`` command:

* ``lmrepro train-scape ...``: one worker of a distributed run, started by ``torchrun`` (the
  program of :mod:`lmrepro.scape.train.worker`, whose flags and docstring say more);
* ``lmrepro scaling``: run or resume the training-length study of ``scape.scaling``
  (:mod:`lmrepro.scape.study.scaling`);
* ``lmrepro workers``: run or resume the worker-count study of ``scape.workers``
  (:mod:`lmrepro.scape.study.workers`).
"""

from __future__ import annotations

import argparse

from lmrepro.scape.train import worker


def run_scaling(args: argparse.Namespace) -> int:
    from lmrepro.errors import check
    from lmrepro.pipeline.params import load_params
    from lmrepro.scape.study.scaling import run_study

    params = load_params(args.params, args.profile)
    check(params.scape.scaling is not None, "scape.scaling", None,
          f"must be set in the profile to run the study (profile {params.profile!r} has none; "
          "try --profile scaling)")
    dirs = run_study(params.scape, params.model, params.data.prepared_dir, args.out)
    print(f"scaling study: {len(dirs)} runs finished under {args.out}")
    return 0


def run_workers(args: argparse.Namespace) -> int:
    from lmrepro.errors import check
    from lmrepro.pipeline.params import load_params
    from lmrepro.scape.study.workers import run_workers_study

    params = load_params(args.params, args.profile)
    check(params.scape.workers is not None, "scape.workers", None,
          f"must be set in the profile to run the study (profile {params.profile!r} has none; "
          "try --profile workers)")
    dirs = run_workers_study(params.scape, params.data.prepared_dir, args.out)
    print(f"workers study: {len(dirs)} verdict runs finished under {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``train-scape`` and ``scaling`` to the ``lmrepro`` command."""
    p = subparsers.add_parser("train-scape", help="one torchrun worker of a SCAPE / baseline run",
                              description=worker.__doc__.split("\n\n")[0])
    worker.add_run_arguments(p)
    p.set_defaults(func=worker.run)
    p = subparsers.add_parser("scaling", help="run or resume the training-length study of "
                              "scape.scaling (lmrepro.scape.study.scaling)")
    p.add_argument("--params", default="params.yaml", help="parameter file")
    p.add_argument("--profile", default=None, help="profile in params.yaml (e.g. scaling)")
    p.add_argument("--out", default="results/scaling", help="the study's stage directory")
    p.set_defaults(func=run_scaling)
    p = subparsers.add_parser("workers", help="run or resume the worker-count study of "
                              "scape.workers (lmrepro.scape.study.workers)")
    p.add_argument("--params", default="params.yaml", help="parameter file")
    p.add_argument("--profile", default=None, help="profile in params.yaml (e.g. workers)")
    p.add_argument("--out", default="results/workers", help="the study's stage directory")
    p.set_defaults(func=run_workers)
