"""``lmrepro predict``: the step-time model (:mod:`lmrepro.scape.steptime`) from the command line.

    lmrepro predict --model-params 1.8e9 --world-size 32 --gpus-per-node 4 \\
        --inter-node-gbit 200 --sparsity 0.99 --json

prints one JSON object with ``dense_step_s``, ``scape_step_s`` and ``speedup`` (dense over SCAPE)
and every part of both steps. Every flag has a default: the paper's machine (TACC Vista, one
GH200 per node, NDR InfiniBand at the low end, 200 Gbit/s per node; 989 TFLOP/s dense BF16 at
50 % MFU) and Llama-1.8B's step (global batch 1024 x 2048 tokens). docs/steptime.md gives the
formulas and sources. Bad input: exit status 2 with one line naming the flag. ``--sparsity`` is
the fraction of each matrix's coordinates SCAPE does not send (0.99: 1 % sent), in [0, 1).
"""

from __future__ import annotations

import argparse
import json

from lmrepro.errors import ParameterError

#: (flag, type, default, help): the model's inputs and their documented defaults
FLAGS: tuple[tuple[str, type, object, str], ...] = (
    ("model-params", float, 1.8e9, "parameters of the model"),
    ("vector-params", float, 0.0, "parameters in 1-D tensors (SCAPE sends them dense)"),
    ("world-size", int, 32, "GPUs (data-parallel ranks)"),
    ("gpus-per-node", int, 1, "GPUs per node (Vista's GH200 nodes: 1)"),
    ("inter-node-gbit", float, 200.0, "network bandwidth per node, Gbit/s (NDR200..NDR400)"),
    ("inter-node-latency-us", float, 5.0, "network latency per message, microseconds"),
    ("intra-node-gbyte", float, 150.0, "intra-node GPU-GPU bandwidth, GB/s (NVLink 4 pair)"),
    ("intra-node-latency-us", float, 2.0, "intra-node latency per message, microseconds"),
    ("tflops", float, 989.0, "peak dense BF16 TFLOP/s per GPU (H100-class GH200)"),
    ("mfu", float, 0.5, "model FLOP utilisation of forward + backward"),
    ("compute-s", float, None, "measured forward + backward seconds per GPU (replaces FLOPs)"),
    ("tokens-per-step", float, 1024 * 2048, "tokens in the global batch"),
    ("flops-per-token", float, None, "training FLOPs per token (default 6 x model-params)"),
    ("hbm-gbyte", float, 4000.0, "GPU memory bandwidth, GB/s (local optimizer work)"),
    ("sparsity", float, 0.99, "SCAPE's sparsity: the fraction of each matrix's coordinates "
     "not sent, in [0, 1) (0.99: 1 %% sent)"),
)
CHOICES: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("payload-dtype", ("fp32", "bf16", "fp16", "fp8"), "fp32", "dtype of SCAPE's values"),
    ("dense-grad-dtype", ("fp32", "bf16", "fp16", "fp8"), "fp32",
     "dtype of the dense gradient reduction (fp32: --accumulate-allreduce-grads-in-fp32)"),
    ("dense-collective", ("all-reduce", "distributed-optimizer"), "all-reduce",
     "dense reduction: DDP all-reduce, or reduce-scatter + bf16 all-gather"),
    ("algorithm", ("ring", "tree", "hierarchical"), "ring", "collective algorithm"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``predict`` flags, each with its documented default."""
    for flag, typ, default, text in FLAGS:
        p.add_argument(f"--{flag}", type=typ, default=default,
                       help=f"{text} (default {default if default is not None else 'none'})")
    for flag, choices, default, text in CHOICES:
        p.add_argument(f"--{flag}", choices=choices, default=default,
                       help=f"{text} (default {default})")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="SCAPE's mask all-gather overlaps the next forward/backward (default)")
    p.add_argument("--overlap-dense", action=argparse.BooleanOptionalAction, default=False,
                   help="the dense reduction overlaps the backward pass (default: no; the "
                   "authors' scripts do not ask for it)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    # the flag before --sparsity: an error that names its replacement (not in --help)
    p.add_argument("--density", nargs="?", action=_Removed, help=argparse.SUPPRESS)


class _Removed(argparse.Action):
    """A removed flag: argparse's error (exit status 2) naming the flag that replaced it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string} was removed: use --sparsity, the fraction of the "
                     "coordinates not sent (--density 0.01 is --sparsity 0.99)")


def _positive(args: argparse.Namespace) -> None:
    for flag, _, _, _ in FLAGS:
        v = getattr(args, flag.replace("-", "_"))
        if flag == "sparsity":        # in [0, 1): checked by the model's Options
            continue
        if v is None or flag in ("vector-params", "inter-node-latency-us",
                                 "intra-node-latency-us"):
            if v is not None and v < 0:
                raise ParameterError(f"--{flag}", v, "must be >= 0")
            continue
        if not v > 0:
            raise ParameterError(f"--{flag}", v, "must be > 0")
    if args.vector_params >= args.model_params:
        raise ParameterError("--vector-params", args.vector_params,
                             "must be smaller than --model-params")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ParameterError as err:     # the model's own parameter names, as flags
        if str(err.name).startswith("--"):
            raise
        raise ParameterError(f"--{str(err.name).replace('_', '-')}", err.value,
                             err.allowed) from None


def _run(args: argparse.Namespace) -> int:
    from lmrepro.scape.steptime import Cluster, Link, LocalWork, Options, Workload, predict

    _positive(args)
    cluster = Cluster(world=args.world_size, gpus_per_node=args.gpus_per_node,
                      intra=Link(args.intra_node_latency_us * 1e-6, args.intra_node_gbyte * 1e9),
                      inter=Link(args.inter_node_latency_us * 1e-6,
                                 args.inter_node_gbit * 1e9 / 8),
                      peak_flops=args.tflops * 1e12, mfu=args.mfu,
                      hbm_bytes_per_s=args.hbm_gbyte * 1e9)
    work = Workload(params=args.model_params, tokens_per_step=args.tokens_per_step,
                    flops_per_token=args.flops_per_token, vector_params=args.vector_params,
                    compute_s=args.compute_s)
    opts = Options(sparsity=args.sparsity, payload_dtype=args.payload_dtype,
                   dense_grad_dtype=args.dense_grad_dtype,
                   dense_collective=args.dense_collective, algorithm=args.algorithm,
                   overlap_mask=args.overlap, overlap_dense=args.overlap_dense)
    r = predict(work, cluster, opts, LocalWork.from_hbm(cluster.hbm_bytes_per_s))
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"dense step {r['dense_step_s']:.4g} s, SCAPE step {r['scape_step_s']:.4g} s: "
              f"speedup {r['speedup']:.3g}x (compute {r['dense']['compute_s']:.4g} s, dense "
              f"communication {r['dense']['comm_s']:.4g} s, SCAPE values "
              f"{r['scape']['values_s']:.4g} s, mask {r['scape']['mask_s']:.4g} s "
              f"({'overlapped' if args.overlap else 'blocking'}))")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``predict`` to the ``lmrepro`` command."""
    p = subparsers.add_parser("predict", help="predicted dense vs SCAPE step time on a cluster "
                              "(alpha-beta model, docs/steptime.md)",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)
