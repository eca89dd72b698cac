"""``lmrepro train-scape``: one worker of a distributed run, started by ``torchrun``::

    torchrun --standalone --nproc-per-node 2 -m lmrepro train-scape --optimizer scape \\
        --sparsity 0.99 --corpus-dir data/prepared/shakespeare --out results/scape/scape99 \\
        --steps 200 --batch-size 8 --lr 1e-3 --warmup 20 --seed 0 \\
        --model-json '{"n_layers": 4, "d_model": 128, "n_heads": 4, "context": 128}'

Multi-node: replace ``--standalone`` by ``--nnodes 2 --node-rank R --rdzv-backend c10d
--rdzv-endpoint HOST:PORT`` (see docs/scape.md). Exit status: 0 done, 1 a distributed failure
(a peer died or timed out; the message names this rank), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from lmrepro.errors import ParameterError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``train-scape`` flags (one per :class:`ScapeTrainConfig` field)."""
    from lmrepro.dist.train_scape import OPTIMIZERS

    p.add_argument("--optimizer", required=True, choices=OPTIMIZERS)
    p.add_argument("--sparsity", type=float, default=None,
                   help="fraction of coordinates not sent, in [0, 1) (default 0.99 for scape/"
                        "topk, 0 for the dense optimizers)")
    p.add_argument("--corpus-dir", required=True, help="prepared corpus (train/val splits)")
    p.add_argument("--out", required=True, help="run directory (rank 0 writes it)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per worker per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-json", default="{}", help="ModelConfig fields as a JSON object")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--eval-batch-size", type=int, default=8)
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0 = never")
    p.add_argument("--resume", dest="resume", action="store_true", default=True,
                   help="resume from OUT/checkpoints when present (default)")
    p.add_argument("--no-resume", dest="resume", action="store_false")
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="process-group timeout: a dead/stalled peer fails the run after this")
    p.add_argument("--mask-score", default="m_abs", help="SCAPE mask score: m_abs | m_over_sqrt_v")
    p.add_argument("--name", default="", help="run name (default from optimizer and sparsity)")
    p.add_argument("--corpus", default="", help="corpus name for summary.json")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))


def config_from_args(args: argparse.Namespace):  # -> ScapeTrainConfig
    from lmrepro.dist.train_scape import ScapeTrainConfig

    try:
        model = json.loads(args.model_json)
    except json.JSONDecodeError as exc:
        raise ParameterError("--model-json", args.model_json, f"must be JSON ({exc})") from None
    sparsity = args.sparsity
    if sparsity is None:
        sparsity = 0.99 if args.optimizer in ("scape", "topk") else 0.0
    return ScapeTrainConfig(
        optimizer=args.optimizer, corpus_dir=args.corpus_dir, out=args.out, sparsity=sparsity,
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
        min_lr_ratio=args.min_lr_ratio, weight_decay=args.weight_decay, beta1=args.beta1,
        beta2=args.beta2, eps=args.eps, seed=args.seed, model=model,
        eval_batches=args.eval_batches, eval_batch_size=args.eval_batch_size,
        checkpoint_every=args.checkpoint_every, resume=args.resume, timeout_s=args.timeout_s,
        mask_score=args.mask_score, name=args.name, corpus=args.corpus, threads=args.threads,
        device=args.device)


def run(args: argparse.Namespace) -> int:
    from lmrepro.dist.runtime import DistributedFailure
    from lmrepro.dist.train_scape import train

    cfg = config_from_args(args)
    try:
        train(cfg)
    except DistributedFailure:
        return 1      # already reported on stderr with this rank's number
    return 0


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``train-scape`` to the ``lmrepro`` command."""
    p = subparsers.add_parser("train-scape", help="one torchrun worker of a SCAPE / baseline run")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m lmrepro.dist.cli train-scape ...``)."""
    parser = argparse.ArgumentParser(prog="lmrepro")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ParameterError as err:
        print(f"lmrepro: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
