"""``lmrepro predict``: the step-time model (:mod:`lmrepro.scape.steptime.model`) from the
command line.

    lmrepro predict --paper-model Llama-500M --compute-s 0.93 --allreduce-busbw-gbyte 3.4 \\
        --sparsity 0.9 --steps-multiplier 1.1:1.3 --json

prints the dense and SCAPE step times, the per-step ``speedup`` (dense over SCAPE) with an
interval, the break-even network rate (above it SCAPE is slower) and, given how many more steps
SCAPE needs to reach the dense run's loss (``--steps-multiplier``, the steps-to-target measure),
the time-to-same-loss ratio ``speedup / multiplier``. Inputs are measured or assumed:

* measured: ``--compute-s`` (a compute-only step: forward + backward per GPU, no
  communication) replaces the FLOP estimate; ``--allreduce-busbw-gbyte`` (the bus bandwidth
  nccl-tests' ``all_reduce_perf`` reports across the nodes, GB/s) is the per-node rate the ring
  all-reduce gets (busbw = size / time x 2 (p-1)/p, the model's own term);
* assumed: ``--inter-node-gbit`` per network link (x ``--nics-per-node``), ``--mfu``.

``--inter-node-gbit``, ``--mfu``, ``--compute-s``, ``--allreduce-busbw-gbyte`` and
``--steps-multiplier`` take a value or a range ``LO:HI``; the interval spans every corner of the
ranges given, the central figure is at their midpoints. The model defaults to the paper's
Llama-1.8B (``--paper-model``: parameters counted from its shape, 2.32e9 with its untied 128k
vocabulary; its tokens per step and FLOPs per token); ``--model-params`` replaces the preset.
The machine defaults to TACC Vista (one GH200 per node, NDR at 200 Gbit/s, MFU 0.5).
docs/steptime.md gives the formulas and sources. Bad input: exit status 2 with one line naming
the flag. ``--sparsity`` is the fraction of each matrix's coordinates SCAPE does not send.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

from lmrepro.errors import ParameterError

Range = tuple[float, float]


def parse_range(text: str) -> Range:
    """``"X"`` -> ``(X, X)``; ``"LO:HI"`` -> ``(LO, HI)`` with ``LO <= HI``."""
    parts = text.split(":")
    try:
        lo, hi = (float(parts[0]), float(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None or not lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number or LO:HI with LO <= HI")
    return lo, hi


#: (flag, type, default, help): the model's inputs and their documented defaults (None: from
#: the paper model, or unused)
FLAGS: tuple[tuple[str, Any, object, str], ...] = (
    ("model-params", float, None, "parameters of the model (default: the paper model's)"),
    ("vector-params", float, None, "parameters in 1-D tensors (SCAPE sends them dense)"),
    ("world-size", int, 32, "GPUs (data-parallel ranks)"),
    ("gpus-per-node", int, 1, "GPUs per node (Vista's GH200 nodes: 1)"),
    ("nics-per-node", int, 1, "network links per node (a NIC per GPU: as many as GPUs)"),
    ("inter-node-gbit", parse_range, None, "rate of one network link, Gbit/s, or LO:HI "
     "(default 200: NDR200; the node's rate is this x --nics-per-node)"),
    ("allreduce-busbw-gbyte", parse_range, None, "measured: nccl-tests all_reduce_perf bus "
     "bandwidth across the nodes, GB/s (or LO:HI); replaces --inter-node-gbit"),
    ("inter-node-latency-us", float, 5.0, "network latency per message, microseconds"),
    ("intra-node-gbyte", float, 150.0, "intra-node GPU-GPU bandwidth, GB/s (NVLink 4 pair)"),
    ("intra-node-latency-us", float, 2.0, "intra-node latency per message, microseconds"),
    ("tflops", float, 989.0, "peak dense BF16 TFLOP/s per GPU (H100-class GH200)"),
    ("mfu", parse_range, (0.5, 0.5), "model FLOP utilisation of forward + backward, or LO:HI"),
    ("compute-s", parse_range, None, "measured: forward + backward seconds per GPU, no "
     "communication (or LO:HI); replaces the FLOP estimate"),
    ("tokens-per-step", float, None, "tokens in the global batch (default: the paper model's)"),
    ("flops-per-token", float, None, "training FLOPs per token (default: the paper model's; "
     "6 x model-params with --model-params)"),
    ("micro-batches", int, 1, "micro-batches per rank and step (an overlapped dense "
     "reduction hides behind the last one's backward pass only)"),
    ("hbm-gbyte", float, 4000.0, "GPU memory bandwidth, GB/s (local optimizer work)"),
    ("selection-s-per-param", float, 0.0, "SCAPE's cost beyond memory passes, seconds per "
     "parameter (the authors' logs measure it: results/steptime/authors_logs.json)"),
    ("selection-s-per-step", float, 0.0, "the same, seconds per step"),
    ("sparsity", float, 0.99, "SCAPE's sparsity: the fraction of each matrix's coordinates "
     "not sent, in [0, 1) (0.99: 1 %% sent)"),
    ("steps-multiplier", parse_range, None, "SCAPE's steps to the dense run's final loss over "
     "dense's (or LO:HI): prints the time-to-same-loss ratio"),
)
RANGES = ("inter-node-gbit", "allreduce-busbw-gbyte", "mfu", "compute-s", "steps-multiplier")
CHOICES: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("payload-dtype", ("fp32", "bf16", "fp16", "fp8"), "fp32", "dtype of SCAPE's values"),
    ("dense-grad-dtype", ("fp32", "bf16", "fp16", "fp8"), "fp32",
     "dtype of the dense gradient reduction (fp32: --accumulate-allreduce-grads-in-fp32)"),
    ("dense-collective", ("all-reduce", "distributed-optimizer"), "all-reduce",
     "dense reduction: DDP all-reduce, or reduce-scatter + bf16 all-gather"),
    ("algorithm", ("ring", "tree", "hierarchical"), "ring", "collective algorithm"),
    ("paper-model", ("GPT-345M", "Llama-500M", "Llama-1.8B"), "Llama-1.8B",
     "the paper's model whose shape, batch and FLOPs per token are the defaults"),
)


def _default_text(default: object) -> str:
    if isinstance(default, tuple):
        return f"{default[0]:g}"
    return "none" if default is None else str(default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``predict`` flags, each with its documented default."""
    for flag, typ, default, text in FLAGS:
        p.add_argument(f"--{flag}", type=typ, default=default,
                       help=f"{text} (default {_default_text(default)})")
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


def _check(args: argparse.Namespace) -> None:
    """Every number > 0 but the ones allowed to be 0; one line naming the flag otherwise."""
    zero_ok = ("vector-params", "inter-node-latency-us", "intra-node-latency-us",
               "selection-s-per-param", "selection-s-per-step", "sparsity")
    for flag, _, _, _ in FLAGS:
        v = getattr(args, flag.replace("-", "_"))
        if v is None or flag == "sparsity":      # sparsity: checked by the model's Options
            continue
        lo = v[0] if isinstance(v, tuple) else v
        if flag in zero_ok:
            if lo < 0:
                raise ParameterError(f"--{flag}", _shown(v), "must be >= 0")
        elif not lo > 0:
            raise ParameterError(f"--{flag}", _shown(v), "must be > 0")
    if args.inter_node_gbit is not None and args.allreduce_busbw_gbyte is not None:
        raise ParameterError("--allreduce-busbw-gbyte", _shown(args.allreduce_busbw_gbyte),
                             "must not be given with --inter-node-gbit (it replaces it)")
    if (args.model_params is not None and args.vector_params is not None
            and args.vector_params >= args.model_params):
        raise ParameterError("--vector-params", args.vector_params,
                             "must be smaller than --model-params")


def _shown(v: object) -> object:
    """A range flag's value as typed: ``X`` or ``LO:HI``."""
    if isinstance(v, tuple):
        return v[0] if v[0] == v[1] else f"{v[0]:g}:{v[1]:g}"
    return v


def scenarios(args: argparse.Namespace) -> tuple[dict[str, float | None],
                                                  list[dict[str, float | None]]]:
    """The central inputs (each range at its midpoint) and every corner of the ranges."""
    given = {f: getattr(args, f.replace("-", "_")) for f in RANGES}
    central = {f: None if v is None else (v[0] + v[1]) / 2 for f, v in given.items()}
    spans = [[(f, end) for end in sorted(set(v))] for f, v in given.items() if v is not None]
    corners = [{**central, **dict(combo)} for combo in itertools.product(*spans)]
    return central, corners or [central]


def _workload(args: argparse.Namespace, values: dict[str, float | None]):
    from lmrepro.scape.steptime import paper as sp
    from lmrepro.scape.steptime.model import Workload

    if args.model_params is None:      # the paper model: its shape, batch and FLOPs per token
        base = next(m for m in sp.MODELS if m.name == args.paper_model).workload()
        params, vec, tokens, fpt = (base.params, base.vector_params, base.tokens_per_step,
                                    base.flops_per_token)
    else:
        params, vec, tokens, fpt = args.model_params, 0.0, 1024.0 * 2048, None
    vec = vec if args.vector_params is None else args.vector_params
    if vec >= params:
        raise ParameterError("--vector-params", vec, f"must be smaller than the model's "
                             f"parameters ({params:g})")
    return Workload(params=params, vector_params=vec,
                    tokens_per_step=args.tokens_per_step or tokens,
                    flops_per_token=args.flops_per_token or fpt,
                    compute_s=values["compute-s"], micro_batches=args.micro_batches)


def _cluster(args: argparse.Namespace, values: dict[str, float | None]):
    from lmrepro.scape.steptime.model import Cluster, Link

    if values["allreduce-busbw-gbyte"] is not None:   # measured per node: split over the NICs
        link = values["allreduce-busbw-gbyte"] * 1e9 / args.nics_per_node
    else:
        link = (values["inter-node-gbit"] or 200.0) * 1e9 / 8
    mfu = values["mfu"]
    assert mfu is not None          # --mfu has a default (0.5)
    return Cluster(world=args.world_size, gpus_per_node=args.gpus_per_node,
                   nics_per_node=args.nics_per_node,
                   intra=Link(args.intra_node_latency_us * 1e-6, args.intra_node_gbyte * 1e9),
                   inter=Link(args.inter_node_latency_us * 1e-6, link),
                   peak_flops=args.tflops * 1e12, mfu=mfu,
                   hbm_bytes_per_s=args.hbm_gbyte * 1e9)


def _evaluate(args: argparse.Namespace, values: dict[str, float | None]) -> dict[str, Any]:
    from lmrepro.scape.steptime.model import LocalWork, Options, predict

    opts = Options(sparsity=args.sparsity, payload_dtype=args.payload_dtype,
                   dense_grad_dtype=args.dense_grad_dtype,
                   dense_collective=args.dense_collective, algorithm=args.algorithm,
                   overlap_mask=args.overlap, overlap_dense=args.overlap_dense)
    c = _cluster(args, values)
    local = LocalWork.from_hbm(c.hbm_bytes_per_s, args.selection_s_per_param,
                               args.selection_s_per_step)
    w = _workload(args, values)
    return {"w": w, "c": c, "o": opts, "local": local, "r": predict(w, c, opts, local)}


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """The prediction at the central inputs with its interval over the corners, the
    break-even rate and, with a steps multiplier, the time-to-same-loss ratio."""
    from lmrepro.scape.steptime.model import bandwidth_for_speedup

    central, corners = scenarios(args)
    mid = _evaluate(args, central)
    speeds = [_evaluate(args, v)["r"]["speedup"] for v in corners]
    r = dict(mid["r"])
    even = bandwidth_for_speedup(1.0, mid["w"], mid["c"], mid["o"], local=mid["local"])
    r["speedup_interval"] = [min(speeds), max(speeds)]
    r["break_even_gbit_per_node"] = None if even is None else even * args.nics_per_node
    r["inputs"] = {"measured": [f for f in ("compute-s", "allreduce-busbw-gbyte")
                                if central[f] is not None],
                   **{f: _shown(getattr(args, f.replace("-", "_"))) for f in RANGES}}
    if central["steps-multiplier"] is not None:
        ratios = [s / v["steps-multiplier"] for s, v in zip(speeds, corners)]
        r["steps_multiplier"] = central["steps-multiplier"]
        r["time_to_loss_ratio"] = r["speedup"] / central["steps-multiplier"]
        r["time_to_loss_interval"] = [min(ratios), max(ratios)]
    return r


def _text(r: dict[str, Any], overlap: bool) -> str:
    lo, hi = r["speedup_interval"]
    parts = [f"dense step {r['dense_step_s']:.4g} s, SCAPE step {r['scape_step_s']:.4g} s: "
             f"speedup {r['speedup']:.3g}x" + (f" (interval {lo:.3g}-{hi:.3g}x over the ranges "
                                               "given)" if hi > lo else "")
             + f" (compute {r['dense']['compute_s']:.4g} s, dense communication "
             f"{r['dense']['comm_s']:.4g} s, SCAPE values {r['scape']['values_s']:.4g} s, mask "
             f"{r['scape']['mask_s']:.4g} s ({'overlapped' if overlap else 'blocking'}))"]
    even = r["break_even_gbit_per_node"]
    parts.append("SCAPE is slower than dense above " + (
        f"{even:.3g} Gbit/s per node" if even is not None else
        "no rate between 0.01 and 1e5 Gbit/s per link (it is faster, or slower, at all)"))
    if "time_to_loss_ratio" in r:
        a, b = r["time_to_loss_interval"]
        parts.append(f"time to the same loss: dense / SCAPE = {r['time_to_loss_ratio']:.3g}x "
                     f"(per-step speedup / steps multiplier {r['steps_multiplier']:.3g}; "
                     f"interval {a:.3g}-{b:.3g}x)")
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ParameterError as err:     # the model's own parameter names, as flags
        if str(err.name).startswith("--"):
            raise
        raise ParameterError(f"--{str(err.name).replace('_', '-')}", err.value,
                             err.allowed) from None


def _run(args: argparse.Namespace) -> int:
    _check(args)
    r = evaluate(args)
    print(json.dumps(r, sort_keys=True) if args.json else _text(r, args.overlap))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``predict`` to the ``lmrepro`` command."""
    p = subparsers.add_parser("predict", help="predicted dense vs SCAPE step time on a cluster "
                              "(alpha-beta model, docs/steptime.md)",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)
