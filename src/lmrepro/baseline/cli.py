"""The baseline wing's subcommand of the ``lmrepro`` command: ``lmrepro train``, the
single-process global-backprop baseline on ``train.corpora`` (:mod:`lmrepro.baseline.stage`)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from lmrepro.baseline.stage import run_suite
    from lmrepro.pipeline.params import load_params

    params = load_params(args.params, args.profile)
    for name, summary in run_suite(params.train, params.model, params.seeds,
                                   params.data.prepared_dir, args.out).items():
        print(f"{name}: {summary['final_bpb']:.4f} bits/byte, "
              f"{summary['tokens_per_s']:.0f} tokens/s")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``train`` to the ``lmrepro`` command."""
    p = subparsers.add_parser("train", help="single-process backprop baseline on train.corpora")
    p.add_argument("--params", default="params.yaml",
                   help="parameter file (default params.yaml)")
    p.add_argument("--profile", default=None,
                   help="profile in params.yaml (default: its 'profile')")
    p.add_argument("--out", default="results/baseline")
    p.set_defaults(func=run)
