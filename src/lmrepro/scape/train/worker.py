"""The SCAPE worker program: one worker of a distributed run, started by ``torchrun``::

    torchrun --standalone --nproc-per-node 2 -m lmrepro.scape.train.worker --optimizer scape \\
        --sparsity 0.99 --corpus-dir data/prepared/shakespeare --out results/scape/scape99 \\
        --steps 200 --batch-size 8 --lr 1e-3 --warmup-steps 20 --seed 0 --model-n-layers 4

The same program is ``lmrepro train-scape`` (:mod:`lmrepro.scape.cli`); this module is its own
entry so that a worker loads no other wing. Every flag but the run's location (``--corpus-dir``,
``--out``, ``--seed``, ``--corpus``, ``--resume``) is generated from
:class:`~lmrepro.scape.config.ScapeConfig`, :class:`~lmrepro.scape.config.ScapeRun` and
:class:`~lmrepro.model.ModelConfig` (``--model-*``): the same names, types, defaults and rules as
the ``scape:`` section of params.yaml. Multi-node: replace ``--standalone`` by ``--nnodes 2
--node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` (see docs/scape.md). Exit status:
0 done, 1 a distributed failure (a peer died or timed out; the message names this rank), 2 bad
input.
"""

from __future__ import annotations

import argparse

from lmrepro.config import add_arguments, from_arguments, to_argv
from lmrepro.model import ModelConfig
from lmrepro.scape.config import ScapeConfig, ScapeRun

#: a run's settings that override the section's: they travel as the section's flags
RUN_OWN = ("lr", "dense_steps")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's flags: generated from the configuration classes, plus the location."""
    p.add_argument("--corpus-dir", required=True, help="prepared corpus (train/val splits)")
    p.add_argument("--out", required=True, help="run directory (rank 0 writes it)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and batch seed")
    p.add_argument("--corpus", default="", help="corpus name for summary.json")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="resume from OUT/checkpoints when present (default)")
    add_arguments(p, ScapeRun, exclude=RUN_OWN)     # --lr, --dense-steps: ScapeConfig's flags
    add_arguments(p, ScapeConfig)
    add_arguments(p, ModelConfig, prefix="model_")


def worker_argv(cfg: ScapeConfig, run: ScapeRun, model: ModelConfig, corpus_dir: str, out: str,
                seed: int, corpus: str = "") -> list[str]:
    """The worker's arguments for one run (what :mod:`lmrepro.scape.train.launch` passes): the run's
    own learning rate and dense steps, when it has them, travel as ``--lr`` and
    ``--dense-steps``."""
    cfg = cfg.replace(lr=run.lr_or(cfg.lr), dense_steps=run.dense_steps_or(cfg.dense_steps))
    return ["--corpus-dir", str(corpus_dir), "--out", str(out), "--seed", str(seed),
            "--corpus", corpus, *to_argv(run, exclude=RUN_OWN), *to_argv(cfg),
            *to_argv(model, prefix="model_")]


def run(args: argparse.Namespace) -> int:
    from lmrepro.lifetime import die_with_torchrun_agent

    die_with_torchrun_agent()      # a worker ends with its agent (docs/reliability.md)
    from lmrepro.distributed import DistributedFailure
    from lmrepro.scape.train.trainer import RunTarget, train

    cfg = from_arguments(ScapeConfig, args)
    run_cfg = from_arguments(ScapeRun, args, exclude=RUN_OWN)   # they came as --lr, ...
    model = from_arguments(ModelConfig, args, prefix="model_") or ModelConfig()
    target = RunTarget(corpus_dir=args.corpus_dir, out=args.out, seed=args.seed,
                       corpus=args.corpus, resume=args.resume)
    try:
        train(cfg, run_cfg, model, target)
    except DistributedFailure:
        return 1      # already reported on stderr with this rank's number
    return 0


def worker_main(argv: list[str] | None = None) -> int:
    """``python -m lmrepro.scape.train.worker ARGS``: the worker without the rest of the ``lmrepro``
    command (the launcher's entry: a worker loads no other wing), with the same flags, errors
    and exit statuses as ``lmrepro train-scape``."""
    from lmrepro.entry import ArgumentParser, execute

    p = ArgumentParser(prog="python -m lmrepro.scape.train.worker",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_run_arguments(p)
    p.set_defaults(func=run)
    return execute(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(worker_main())
