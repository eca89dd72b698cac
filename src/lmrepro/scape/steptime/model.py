"""A step-time model of data-parallel training: dense AdamW / AdamS against SCAPE.

Every collective is priced with the latency-bandwidth (alpha-beta) model of Hockney (1994):
``t = alpha + n / B`` per message. The algorithm costs are the ones of the collective-algorithm
literature and of NCCL's documentation (nccl-tests ``doc/PERFORMANCE.md``: the "bus bandwidth"
of an all-reduce is ``2 (p-1)/p`` times the data size over the time, of a reduce-scatter or an
all-gather ``(p-1)/p`` times):

* ring all-reduce of ``n`` bytes over ``p`` ranks (Patarasuk & Yuan 2009; Thakur, Rabenseifner &
  Gropp 2005): ``2 (p-1) alpha + 2 (p-1)/p * n / B``;
* ring reduce-scatter (``n`` = the full input per rank) and ring all-gather (``n`` = the full
  output): ``(p-1) alpha + (p-1)/p * n / B``;
* NCCL's double binary tree all-reduce: ``2 log2(p) alpha + 2 n / B`` (a pipelined reduce then
  broadcast; the bandwidth term is the bound for large messages);
* hierarchical all-reduce over nodes of ``g`` GPUs: reduce-scatter inside the node, one ring
  all-reduce of ``n/g`` per GPU among the ``p/g`` nodes (the ``g`` of them sharing the node's
  network link), all-gather inside the node.

On a machine with several GPUs per node, a flat ring crosses the network once per node: each
node's links carry ``2 (p-1)/p * n`` bytes, so the ring's bandwidth term uses the network rate
*per node* whenever the job spans more than one node: the rate of one link times the node's
link (NIC) count (``Cluster.nics_per_node``; a node with a NIC per GPU sums them). With one NIC
per node, 4 GPUs per node move no more bytes per second than 1.

A step is ``compute + local optimizer work + blocking communication + the part of asynchronous
communication not hidden behind compute``. SCAPE's step (arXiv 2607.01678, as this project
implements it, docs/scape.md) has one blocking all-reduce of the fp32 values of the corrected
momentum on the mask (``k = ceil((1 - sparsity) * numel)`` per matrix, 1-D tensors dense) and
one asynchronous all-gather of the next step's mask (each rank's owned span as int32 indices or
a bitmap, whichever is smaller), which overlaps the next forward/backward. Pure functions; the
formulas are written out in docs/steptime.md (where ``d = 1 - sparsity``, the fraction
sent, is only a name inside the formulas).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from lmrepro.errors import check

#: bytes per element of the payload dtypes
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
ALGORITHMS = ("ring", "tree", "hierarchical")
DENSE_COLLECTIVES = ("all-reduce", "distributed-optimizer")


@dataclass(frozen=True)
class Link:
    """One kind of link: latency ``alpha_s`` (s) and bandwidth ``bytes_per_s`` (per node for the
    network, per GPU pair for the intra-node fabric)."""

    alpha_s: float
    bytes_per_s: float

    def time(self, nbytes: float) -> float:
        """``alpha + n / B`` for one message of ``nbytes`` (0 bytes: no message)."""
        return 0.0 if nbytes <= 0 else self.alpha_s + nbytes / self.bytes_per_s


def ring_all_reduce_s(nbytes: float, p: int, link: Link) -> float:
    """``2 (p-1) alpha + 2 (p-1)/p * n / B`` (Patarasuk & Yuan 2009)."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (p - 1) * link.alpha_s + 2 * (p - 1) / p * nbytes / link.bytes_per_s


def ring_reduce_scatter_s(nbytes: float, p: int, link: Link) -> float:
    """``(p-1) alpha + (p-1)/p * n / B``, ``n`` the full input per rank."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return (p - 1) * link.alpha_s + (p - 1) / p * nbytes / link.bytes_per_s


def ring_all_gather_s(nbytes_total: float, p: int, link: Link) -> float:
    """``(p-1) alpha + (p-1)/p * n / B``, ``n`` the gathered output (all ranks' parts)."""
    return ring_reduce_scatter_s(nbytes_total, p, link)


def tree_all_reduce_s(nbytes: float, p: int, link: Link) -> float:
    """NCCL's double binary tree: ``2 log2(p) alpha + 2 n / B``."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.log2(p) * link.alpha_s + 2 * nbytes / link.bytes_per_s


@dataclass(frozen=True)
class Cluster:
    """The machine: ``world`` GPUs, ``gpus_per_node`` per node, the intra-node and network links,
    peak throughput and model FLOP utilisation, memory bandwidth (the local optimizer work is
    memory-bound)."""

    world: int = 32
    gpus_per_node: int = 1
    intra: Link = Link(2e-6, 150e9)
    inter: Link = Link(5e-6, 200e9 / 8)
    peak_flops: float = 989e12
    mfu: float = 0.5
    hbm_bytes_per_s: float = 4e12
    nics_per_node: int = 1

    def __post_init__(self) -> None:
        check(self.world >= 1, "world_size", self.world, "must be an integer >= 1")
        for name in ("gpus_per_node", "nics_per_node"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, v, "must be an integer >= 1")
        check(self.world % self.gpus_per_node == 0 or self.world < self.gpus_per_node,
              "world_size", self.world, f"must be a multiple of gpus_per_node "
              f"({self.gpus_per_node})")
        for name, v in (("inter_node_bandwidth", self.inter.bytes_per_s),
                        ("intra_node_bandwidth", self.intra.bytes_per_s),
                        ("peak_flops", self.peak_flops), ("hbm_bandwidth", self.hbm_bytes_per_s)):
            check(v > 0, name, v, "must be > 0")
        check(0 < self.mfu <= 1, "mfu", self.mfu, "must be in (0, 1]")
        check(min(self.inter.alpha_s, self.intra.alpha_s) >= 0, "latency",
              (self.inter.alpha_s, self.intra.alpha_s), "must be >= 0")

    @property
    def nodes(self) -> int:
        return max(1, self.world // self.gpus_per_node)

    @property
    def net(self) -> Link:
        """The node's network: ``inter`` (one link) times ``nics_per_node``."""
        return Link(self.inter.alpha_s, self.inter.bytes_per_s * self.nics_per_node)


def all_reduce_s(nbytes: float, c: Cluster, algorithm: str = "ring") -> float:
    """An all-reduce of ``nbytes`` per GPU on ``c`` with ``algorithm`` (:data:`ALGORITHMS`)."""
    check(algorithm in ALGORITHMS, "algorithm", algorithm, f"must be one of {ALGORITHMS}")
    p, g = c.world, min(c.gpus_per_node, c.world)
    if c.nodes == 1:                       # one node: everything on the intra-node fabric
        return (tree_all_reduce_s if algorithm == "tree" else ring_all_reduce_s)(
            nbytes, p, c.intra)
    if algorithm == "ring":                # the ring crosses each node's network once
        return (2 * (p - g) * c.inter.alpha_s + 2 * (g - 1) * c.intra.alpha_s
                + 2 * (p - 1) / p * nbytes / c.net.bytes_per_s)
    if algorithm == "tree":
        return tree_all_reduce_s(nbytes, c.nodes, c.net) + (
            ring_all_reduce_s(nbytes, g, c.intra) if g > 1 else 0.0)
    n = c.nodes                            # hierarchical: RS in node, g rings of n/g, AG in node
    inter = (2 * (n - 1) * c.inter.alpha_s
             + 2 * (n - 1) / n * nbytes / c.net.bytes_per_s)     # g rings share the network
    return 2 * ring_reduce_scatter_s(nbytes, g, c.intra) + inter


def all_gather_s(nbytes_total: float, c: Cluster) -> float:
    """A ring all-gather whose output is ``nbytes_total``; each node's link carries
    ``(p-1)/p`` of it (its own part leaves once, the others' parts arrive once)."""
    p, g = c.world, min(c.gpus_per_node, c.world)
    if c.nodes == 1:
        return ring_all_gather_s(nbytes_total, p, c.intra)
    return ((p - g) * c.inter.alpha_s + (g - 1) * c.intra.alpha_s
            + (p - 1) / p * nbytes_total / c.net.bytes_per_s)


def reduce_scatter_s(nbytes: float, c: Cluster) -> float:
    """A ring reduce-scatter of ``nbytes`` per GPU (same cost structure as the all-gather)."""
    return all_gather_s(nbytes, c)


@dataclass(frozen=True)
class LocalWork:
    """Per-step local optimizer work in seconds per element: the dense optimizer's update per
    parameter, SCAPE's extra per parameter (error feedback, corrected momentum, scatter; its
    owner top-k over ``1/p`` of the parameters folded in on the benchmark), the owner's top-k per
    owned coordinate and the work per kept element (encoding, decoding, gather/scatter).
    Defaults: memory-bound GPU passes, bytes per element over 4 TB/s of HBM.

    ``selection_s_per_param`` and ``selection_s_per_step``: what a SCAPE step costs beyond
    those passes (the top-k selection kernels, per-tensor launches and copies), per parameter
    or fixed per step. 0 by default (an assumption: memory passes only); the authors' logs
    measure it (:mod:`lmrepro.scape.authors.fit`: their SCAPE step at density ~1 against the
    model), but not how it scales with the model: per parameter and per step bracket that."""

    dense_s_per_param: float = 28 / 4e12
    scape_extra_s_per_param: float = 24 / 4e12
    topk_s_per_owned: float = 16 / 4e12
    s_per_kept: float = 16 / 4e12
    selection_s_per_param: float = 0.0
    selection_s_per_step: float = 0.0

    @classmethod
    def from_hbm(cls, hbm_bytes_per_s: float, selection_s_per_param: float = 0.0,
                 selection_s_per_step: float = 0.0) -> LocalWork:
        return cls(28 / hbm_bytes_per_s, 24 / hbm_bytes_per_s, 16 / hbm_bytes_per_s,
                   16 / hbm_bytes_per_s, selection_s_per_param, selection_s_per_step)


@dataclass(frozen=True)
class Workload:
    """One training step: ``params`` parameters (``vector_params`` of them in 1-D tensors, sent
    dense by SCAPE), ``tokens_per_step`` in the global batch and the training FLOPs per token
    (default ``6 * params``); ``compute_s`` (forward + backward per GPU), when given, replaces
    the FLOP estimate (a measured compute time); ``micro_batches`` per rank and step (gradient
    accumulation: an overlapped reduction can hide only behind the last one's backward pass).
    """

    params: float
    tokens_per_step: float = 1024 * 2048
    flops_per_token: float | None = None
    vector_params: float = 0.0
    compute_s: float | None = None
    micro_batches: int = 1

    def __post_init__(self) -> None:
        check(self.params > 0, "model_params", self.params, "must be > 0")
        check(isinstance(self.micro_batches, int) and self.micro_batches >= 1, "micro_batches",
              self.micro_batches, "must be an integer >= 1")
        check(self.tokens_per_step > 0, "tokens_per_step", self.tokens_per_step, "must be > 0")
        check(self.compute_s is None or self.compute_s > 0, "compute_s", self.compute_s,
              "must be > 0 when given")


@dataclass(frozen=True)
class Options:
    """How the methods communicate: SCAPE's sparsity (the fraction of each matrix's coordinates
    not sent, in [0, 1): 0.99 sends 1 %), the dtypes of SCAPE's values and of the dense gradient
    reduction, the dense collective (DDP all-reduce or a distributed optimizer's reduce-scatter
    + all-gather of bf16 parameters), the algorithm, whether SCAPE's mask all-gather overlaps
    compute and whether the dense reduction overlaps the backward pass."""

    sparsity: float = 0.99
    payload_dtype: str = "fp32"
    dense_grad_dtype: str = "fp32"
    dense_collective: str = "all-reduce"
    algorithm: str = "ring"
    overlap_mask: bool = True
    overlap_dense: bool = False

    def __post_init__(self) -> None:
        check(0 <= self.sparsity < 1, "sparsity", self.sparsity, "must be in [0, 1)")
        for name in ("payload_dtype", "dense_grad_dtype"):
            v = getattr(self, name)
            check(v in DTYPE_BYTES, name, v, f"must be one of {tuple(DTYPE_BYTES)}")
        check(self.dense_collective in DENSE_COLLECTIVES, "dense_collective",
              self.dense_collective, f"must be one of {DENSE_COLLECTIVES}")
        check(self.algorithm in ALGORITHMS, "algorithm", self.algorithm,
              f"must be one of {ALGORITHMS}")


def compute_s(w: Workload, c: Cluster) -> float:
    """Forward + backward seconds per GPU: measured, or FLOPs / (peak * MFU)."""
    if w.compute_s is not None:
        return w.compute_s
    fpt = w.flops_per_token if w.flops_per_token is not None else 6.0 * w.params
    return w.tokens_per_step / c.world * fpt / (c.peak_flops * c.mfu)


def kept(w: Workload, sparsity: float) -> float:
    """Elements SCAPE sends: ``1 - sparsity`` of the matrices' coordinates, every 1-D
    coordinate."""
    density = 1.0 - sparsity
    return density * (w.params - w.vector_params) + w.vector_params


def mask_bytes_per_rank(w: Workload, sparsity: float, world: int) -> float:
    """One rank's mask part: int32 indices of its owned span or a bitmap of it, the smaller."""
    owned = (w.params - w.vector_params) / world
    density = 1.0 - sparsity
    return min(4.0 * density * owned, owned / 8.0)


def dense_step(w: Workload, c: Cluster, o: Options, local: LocalWork | None = None
               ) -> dict[str, float]:
    """Dense AdamW / AdamS: compute, the gradient reduction, the optimizer update."""
    local = local or LocalWork.from_hbm(c.hbm_bytes_per_s)
    comp = compute_s(w, c)
    grad = w.params * DTYPE_BYTES[o.dense_grad_dtype]
    if o.dense_collective == "all-reduce":
        comm = all_reduce_s(grad, c, o.algorithm)
        upd = w.params * local.dense_s_per_param
    else:   # distributed optimizer: each rank updates 1/p, then the bf16 parameters gathered
        comm = reduce_scatter_s(grad, c) + all_gather_s(w.params * 2, c)
        upd = w.params / c.world * local.dense_s_per_param
    # an overlapped reduction (Megatron's --overlap-grad-reduce) starts its buckets during the
    # last micro-batch's backward pass: it hides behind 2/3 of that micro-batch's compute only
    hidden = 2 / 3 * comp / w.micro_batches
    exposed = max(0.0, comm - hidden) if o.overlap_dense else comm
    return {"compute_s": comp, "local_s": upd, "comm_s": comm, "exposed_comm_s": exposed,
            "step_s": comp + upd + exposed}


def scape_step(w: Workload, c: Cluster, o: Options, local: LocalWork | None = None,
               sparsity: float | None = None) -> dict[str, float]:
    """SCAPE: compute, local work, the value all-reduce, the (overlapped) mask all-gather;
    at ``sparsity`` when given (the warm-up), else at ``o.sparsity``."""
    local = local or LocalWork.from_hbm(c.hbm_bytes_per_s)
    s = o.sparsity if sparsity is None else sparsity
    comp = compute_s(w, c)
    k = kept(w, s)
    values = all_reduce_s(k * DTYPE_BYTES[o.payload_dtype], c, o.algorithm)
    mask = all_gather_s(mask_bytes_per_rank(w, s, c.world) * c.world, c) if c.world > 1 else 0.0
    loc = (w.params * (local.dense_s_per_param + local.scape_extra_s_per_param
                       + local.selection_s_per_param)
           + w.params / c.world * local.topk_s_per_owned + k * local.s_per_kept
           + local.selection_s_per_step)
    exposed_mask = max(0.0, mask - comp) if o.overlap_mask else mask
    return {"compute_s": comp, "local_s": loc, "values_s": values, "mask_s": mask,
            "exposed_mask_s": exposed_mask, "step_s": comp + loc + values + exposed_mask}


def predict(w: Workload, c: Cluster, o: Options, local: LocalWork | None = None
            ) -> dict[str, Any]:
    """Dense and SCAPE step times and ``speedup = dense / SCAPE``, with their parts."""
    dense = dense_step(w, c, o, local)
    scape = scape_step(w, c, o, local)
    return {"dense_step_s": dense["step_s"], "scape_step_s": scape["step_s"],
            "speedup": dense["step_s"] / scape["step_s"], "dense": dense, "scape": scape,
            "dense_bytes_per_gpu": w.params * DTYPE_BYTES[o.dense_grad_dtype],
            "scape_value_bytes_per_gpu": kept(w, o.sparsity) * DTYPE_BYTES[o.payload_dtype],
            "scape_mask_bytes_per_gpu": mask_bytes_per_rank(w, o.sparsity, c.world),
            "workload": asdict(w), "cluster": _cluster_dict(c), "options": asdict(o)}


def _cluster_dict(c: Cluster) -> dict[str, Any]:
    d = asdict(c)
    d["inter_node_gbit"] = c.inter.bytes_per_s * 8 / 1e9
    return d


def run_wallclock(w: Workload, c: Cluster, o: Options, total_steps: int, dense_steps: int = 0,
                  ramp_steps: int = 0, local: LocalWork | None = None) -> dict[str, float]:
    """Wall-clock of a whole run: dense for ``dense_steps``, sparsity ramped linearly from 0 to
    ``o.sparsity`` over ``ramp_steps`` (mean of 64 points), then at ``o.sparsity``; against
    ``total_steps`` dense steps. Returns both times and the saving ``1 - scape / dense``."""
    check(0 <= dense_steps + ramp_steps <= total_steps, "warm-up steps",
          (dense_steps, ramp_steps), f"must add up to at most total_steps ({total_steps})")
    t_dense = dense_step(w, c, o, local)["step_s"]
    ramp = [scape_step(w, c, o, local, sparsity=o.sparsity * (i + 0.5) / 64)["step_s"]
            for i in range(64)]
    t_ramp = sum(ramp) / len(ramp)
    t_sparse = scape_step(w, c, o, local)["step_s"]
    scape = (dense_steps * t_dense + ramp_steps * t_ramp
             + (total_steps - dense_steps - ramp_steps) * t_sparse)
    dense = total_steps * t_dense
    return {"dense_run_s": dense, "scape_run_s": scape, "saving": 1 - scape / dense}


def weak_scaling(w: Workload, c: Cluster, o: Options, worlds: tuple[int, ...] = (8, 32, 128),
                 local: LocalWork | None = None) -> list[dict[str, float]]:
    """Weak scaling: the per-GPU batch of ``c.world`` kept at every world size; efficiency is
    the smallest world's step time over this world's (1 = no communication stall added)."""
    per_gpu = w.tokens_per_step / c.world
    rows = []
    for p in worlds:
        cp = replace(c, world=p)
        wp = replace(w, tokens_per_step=per_gpu * p)
        r = predict(wp, cp, o, local)
        rows.append({"world": p, "dense_step_s": r["dense_step_s"],
                     "scape_step_s": r["scape_step_s"], "speedup": r["speedup"]})
    for r in rows:
        r["dense_efficiency"] = rows[0]["dense_step_s"] / r["dense_step_s"]
        r["scape_efficiency"] = rows[0]["scape_step_s"] / r["scape_step_s"]
    return rows


def bandwidth_for_speedup(target: float, w: Workload, c: Cluster, o: Options,
                          lo_gbit: float = 0.01, hi_gbit: float = 1e5,
                          local: LocalWork | None = None) -> float | None:
    """The rate of one network link (Gbit/s; the node has ``c.nics_per_node``) at which the
    predicted speedup equals ``target`` (speedup falls as bandwidth grows); None when no rate
    in the range gives it."""
    def s(gbit: float) -> float:
        cc = replace(c, inter=Link(c.inter.alpha_s, gbit * 1e9 / 8))
        return float(predict(w, cc, o, local)["speedup"])

    if not s(lo_gbit) >= target >= s(hi_gbit):
        return None
    lo, hi = math.log(lo_gbit), math.log(hi_gbit)
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if s(math.exp(mid)) > target else (lo, mid)
    return math.exp((lo + hi) / 2)
