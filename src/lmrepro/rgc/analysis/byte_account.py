"""Tensor bytes of an RGC run by stage and by kind, computed from its configuration.

The paper attributes async RGC's memory (4.31 GiB against backprop's 1.94) to "activation
copies and snapshots". This module counts, from an :class:`RGCConfig` alone, what each process
of each executor holds as tensors (float32, 4 bytes; byte ids int64) at its peak within a step,
so a measured peak can be split into the model's tensors and the rest (runtimes, allocator):

* ``parameters``: the stages' own parameters (stage 0 with the embedding);
* ``gradients``: their ``.grad`` (alive from the first backward to the next ``zero_grad``);
* ``optimizer_state``: AdamW's two moments (``exp_avg``, ``exp_avg_sq``) and its ``step`` scalar
  per tensor (``foreach=False``: no multi-tensor temporaries);
* ``activations_kept``: the tensors autograd saves for the backward of the stages' blocks, per
  micro-batch (:func:`block_saved_bytes`), times the micro-batches kept at once: the async
  executor keeps one micro-batch's graph per stage with H = 1 (freed after its backward) and
  all M of a stage a gradient comes back to with H > 1 (the last stage: one), for the
  ``delay + 1`` steps in flight when running ahead (docs/rgc.md, "Running ahead"); backprop
  keeps one micro-batch of the whole model (it accumulates micro-batch by micro-batch);
* ``stashed_weights``: running ahead, the snapshots of a waiting stage's parameters its kept
  graphs were built on, one per step in flight (0 in lockstep);
* ``readout_transient``: one readout's saved tensors (LayerNorm, log-softmax over 256 bytes),
  freed at once by the async executor, part of the micro-batch graph in backprop;
* ``queued_copies``: the activation (and, H > 1, gradient) copies a worker has sent and the next
  has not yet taken, at most ``RGCConfig.queue_capacity`` per queue (numpy copies pickled
  through the pipe: the sender's graph is not shared); the received copy is the next stage's
  input (counted in its ``activations_kept``);
* ``decoder_copies``: each worker's replica of the shared decoder: parameters, gradient, AdamW
  moments and the flattened all-reduce buffer (with a stale consensus, s more pending);
* ``snapshot``: the state handed over for a checkpoint or at the end. With a run directory
  (every pipeline run: ``via="file"``) each worker streams its part to its own file and the
  parent reads one part at a time into its model, then clones the final state: the parent holds
  the largest part and the clone. Without one (``via="bytes"``) each worker sends its parameters
  and optimizer state as ``torch.save`` bytes (worker 0 adds the decoder's) and the parent holds
  every worker's state and the assembled model. Backprop: the final ``state_dict`` clone.

The saved-tensor counts are those of this torch's CPU kernels (scaled-dot-product attention by
the flash kernel: q, k, v, the output and a log-sum-exp per head and token, no T x T matrix),
checked against ``torch.autograd.graph.saved_tensors_hooks`` in the tests and by the paper-shape
benchmark (``bench/bench_rgc_paper_shape.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from lmrepro.errors import check
from lmrepro.model import VOCAB_SIZE
from lmrepro.rgc.config import RGCConfig

FLOAT = 4      # float32
INDEX = 8      # int64 byte ids and targets
KINDS = ("parameters", "gradients", "optimizer_state", "activations_kept", "stashed_weights",
         "readout_transient", "queued_copies", "decoder_copies", "snapshot")


def block_parameters(cfg: RGCConfig) -> int:
    """Parameters of one transformer block: two LayerNorms, qkv and output projections (with
    bias), the MLP (with bias)."""
    d, h = cfg.model.d_model, cfg.model.mlp_ratio * cfg.model.d_model
    return 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * h + h) + (h * d + d)


def embedding_parameters(cfg: RGCConfig) -> int:
    return (VOCAB_SIZE + cfg.model.context) * cfg.model.d_model


def decoder_parameters(cfg: RGCConfig) -> int:
    """The readout: final LayerNorm and the 256-way projection (no bias)."""
    return 2 * cfg.model.d_model + cfg.model.d_model * VOCAB_SIZE


def stage_parameters(cfg: RGCConfig, k: int) -> int:
    return cfg.layers_per_stage * block_parameters(cfg) + (embedding_parameters(cfg) if k == 0
                                                           else 0)


def stage_tensors(cfg: RGCConfig, k: int) -> int:
    """Parameter tensors of stage k (12 per block, 2 for the embedding)."""
    return 12 * cfg.layers_per_stage + (2 if k == 0 else 0)


def model_parameters(cfg: RGCConfig) -> int:
    return cfg.model.n_layers * block_parameters(cfg) + embedding_parameters(cfg) \
        + decoder_parameters(cfg)


def block_saved_bytes(cfg: RGCConfig, micro_batch: int | None = None) -> int:
    """Bytes autograd saves in one block's forward for its backward, parameters excluded, for
    ``micro_batch`` sequences (default the configuration's) of ``context`` bytes. Per token:
    the block input, LayerNorm 1's output, qkv (3d), the attention output (the output
    projection's input is a view of it), the residual sum, LayerNorm 2's output, the MLP's
    hidden pre- and post-GELU (2 x mlp_ratio x d); LayerNorm mean and rstd (2 x 2 floats); the
    attention's log-sum-exp (one per head)."""
    b = cfg.micro_batch_size if micro_batch is None else micro_batch
    d = cfg.model.d_model
    per_token = (5 + 3 + 2 * cfg.model.mlp_ratio) * d + 4 + cfg.model.n_heads
    return FLOAT * b * cfg.model.context * per_token


def embedding_saved_bytes(cfg: RGCConfig, micro_batch: int | None = None) -> int:
    """The embedding saves the byte ids and the positions (int64)."""
    b = cfg.micro_batch_size if micro_batch is None else micro_batch
    return INDEX * (b * cfg.model.context + cfg.model.context)


def readout_saved_bytes(cfg: RGCConfig, micro_batch: int | None = None) -> int:
    """One readout with its loss: the input and LayerNorm output (2d), mean and rstd, the
    log-softmax over 256 bytes, the targets (int64), and the loss's scalar."""
    b = cfg.micro_batch_size if micro_batch is None else micro_batch
    n = b * cfg.model.context
    return FLOAT * n * (2 * cfg.model.d_model + 2 + VOCAB_SIZE) + INDEX * n + FLOAT


def stage_saved_bytes(cfg: RGCConfig, k: int, micro_batch: int | None = None) -> int:
    """Saved tensors of stage k's blocks (and embedding, stage 0) for one micro-batch."""
    return cfg.layers_per_stage * block_saved_bytes(cfg, micro_batch) + (
        embedding_saved_bytes(cfg, micro_batch) if k == 0 else 0)


def activation_message_bytes(cfg: RGCConfig) -> int:
    """One forward message between workers: the activation (b, T, d) and the targets (int64)."""
    n = cfg.micro_batch_size * cfg.model.context
    return FLOAT * n * cfg.model.d_model + INDEX * n


def gradient_message_bytes(cfg: RGCConfig, k: int) -> int:
    """One backward message from stage k to k-1 (H > 1): one (b, T, d) gradient per group of
    losses that continues below k (at most min(k, H - 1))."""
    groups = min(k, cfg.horizon - 1)
    return FLOAT * cfg.micro_batch_size * cfg.model.context * cfg.model.d_model * groups


def _adam_bytes(n_params: int, n_tensors: int) -> int:
    return 2 * FLOAT * n_params + FLOAT * n_tensors


#: how a running-ahead worker's gradients are delayed (docs/rgc.md, "The delay decided"):
#: ``whole``, the executors' rule (a worker's whole backward waits for the gradients from above,
#: :attr:`RGCConfig.stage_gradient_delays`), or ``per_hop`` (accounted, not implemented)
DELAY_RULES = ("whole", "per_hop")


def gradient_delays(cfg: RGCConfig, rule: str = "whole") -> list[int]:
    """Steps by which the latest part of each stage's gradient arrives after its graph was
    built. ``whole``: :attr:`RGCConfig.stage_gradient_delays`, ``s (W - 1 - w)``: a worker
    backpropagates an older step's graphs whole, once every gradient from above is in, and what
    it sends on is that late too, so the delays add up the pipeline whatever the horizon.
    ``per_hop``: each part goes down as soon as it exists and each worker boundary it crosses
    adds s, so stage k's latest part is the loss of the highest stage its gradient comes from,
    ``min(K - 1, k + H - 1)``: ``s x (boundaries between k and that stage)``. The two agree at
    H = K and in lockstep."""
    check(rule in DELAY_RULES, "delay rule", rule, f"must be one of {list(DELAY_RULES)}")
    if rule == "whole" or not cfg.runs_ahead:
        return list(cfg.stage_gradient_delays)
    worker = {k: w for w, stages in enumerate(cfg.placement) for k in stages}
    K, H, s = cfg.n_stages, cfg.horizon, cfg.consensus_staleness
    return [s * (worker[min(K - 1, k + H - 1)] - worker[k]) for k in range(K)]


def async_account(cfg: RGCConfig, via: str = "file", delay_rule: str = "whole"
                  ) -> dict[str, Any]:
    """Bytes by kind for each worker of the async executor (and the parent), at the peak of a
    step (the end of the forward phase, gradients and optimizer state alive), plus the
    hand-over snapshot (``via``: ``"file"``, a run directory, or ``"bytes"``; module
    docstring). Running ahead, ``delay_rule`` (:func:`gradient_delays`) sets the steps of
    graphs a stage keeps; ``whole`` stashes the weights of every stage a gradient comes back to
    (as the executor does), ``per_hop`` only where a part arrives after an update. Returns
    ``{"workers": [{"stages", "bytes": {kind: n}, "total"}, ...], "parent": {...}, "total":
    n}``."""
    check(via in ("file", "bytes"), "via", via, "must be 'file' or 'bytes'")
    K, M, H = cfg.n_stages, cfg.micro_batches, cfg.horizon
    delays = gradient_delays(cfg, delay_rule)
    n_dec = decoder_parameters(cfg)
    dec_tensors = 3
    workers: list[dict[str, Any]] = []
    parts: list[int] = []
    for w, stages in enumerate(cfg.placement):
        own = sum(stage_parameters(cfg, k) for k in stages)
        own_t = sum(stage_tensors(cfg, k) for k in stages)
        kept = stashed = 0
        for k in stages:
            waits = H > 1 and k < K - 1
            steps = delays[k] + 1
            kept += (M * steps if waits else 1) * stage_saved_bytes(cfg, k)
            stashes = cfg.runs_ahead and waits if delay_rule == "whole" else delays[k] > 0
            stashed += FLOAT * stage_parameters(cfg, k) * steps if stashes else 0
        last, q = stages[-1], cfg.queue_capacity
        queued = q * activation_message_bytes(cfg) if last < K - 1 else 0
        if H > 1 and stages[0] > 0:
            queued += q * gradient_message_bytes(cfg, stages[0])
        part = FLOAT * own + _adam_bytes(own, own_t)
        if w == 0:
            part += FLOAT * n_dec + _adam_bytes(n_dec, dec_tensors)
        parts.append(part)
        snapshot = part if via == "bytes" else 0      # a file is streamed, not buffered
        b = {"parameters": FLOAT * own, "gradients": FLOAT * own,
             "optimizer_state": _adam_bytes(own, own_t), "activations_kept": kept,
             "stashed_weights": stashed, "readout_transient": readout_saved_bytes(cfg),
             "queued_copies": queued,
             # parameters, gradient, 2 AdamW moments, the all-reduce buffer, s pending
             "decoder_copies": FLOAT * n_dec * (5 + cfg.consensus_staleness)
             + FLOAT * dec_tensors,
             "snapshot": snapshot}
        workers.append({"worker": w, "stages": list(stages), "bytes": b,
                        "total": sum(b.values())})
    full = FLOAT * model_parameters(cfg)
    optim_all = sum(_adam_bytes(stage_parameters(cfg, k), stage_tensors(cfg, k))
                    for k in range(K)) + _adam_bytes(n_dec, 3)
    # the template model; by bytes: every worker's state received (parameters + optimizer
    # state) and the final state assembled, then cloned; by file: one part at a time, the clone
    parent = {"parameters": full, "snapshot": full + optim_all + full if via == "bytes"
              else max(parts) + full}
    return {"executor": "async", "workers": workers,
            "parent": {"bytes": parent, "total": sum(parent.values())},
            "total": sum(int(x["total"]) for x in workers) + sum(parent.values())}


def backprop_account(cfg: RGCConfig) -> dict[str, Any]:
    """Bytes by kind of the global-backprop executor (one process): the whole model, its
    gradients and AdamW state, one micro-batch's graph of every block, the embedding and the
    readout, and the final state's clone."""
    full = model_parameters(cfg)
    n_tensors = 12 * cfg.model.n_layers + 2 + 3
    kept = sum(stage_saved_bytes(cfg, k) for k in range(cfg.n_stages))
    b = {"parameters": FLOAT * full, "gradients": FLOAT * full,
         "optimizer_state": _adam_bytes(full, n_tensors), "activations_kept": kept,
         "stashed_weights": 0, "readout_transient": readout_saved_bytes(cfg), "queued_copies": 0,
         "decoder_copies": 0, "snapshot": FLOAT * full}
    return {"executor": "backprop", "bytes": b, "total": sum(b.values())}


def peak_in_step(by_kind: dict[str, int]) -> int:
    """Bytes alive at once inside a training step (the snapshot comes after the last step)."""
    return sum(v for k, v in by_kind.items() if k != "snapshot")


def dominant_difference(async_acc: dict[str, Any], backprop_acc: dict[str, Any]
                        ) -> list[tuple[str, int]]:
    """Async's bytes minus backprop's, by kind, over the whole async tree (workers and
    parent), largest first: what explains the difference."""
    diff = {k: 0 for k in KINDS}
    for w in async_acc["workers"]:
        for k, v in w["bytes"].items():
            diff[k] += v
    for k, v in async_acc["parent"]["bytes"].items():
        diff[k] += v
    for k, v in backprop_acc["bytes"].items():
        diff[k] -= v
    return sorted(diff.items(), key=lambda kv: -abs(kv[1]))


def measure_saved_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()
                        ) -> tuple[int, Any]:
    """``(bytes, fn())``: the bytes of the distinct storages autograd saves for the backward
    while ``fn`` runs (``saved_tensors_hooks``), leaving out those of ``exclude`` (the
    parameters, which a Linear saves too)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


#: the kinds of the account alive while the workers train (the hand-over's snapshot is not;
#: nor is the async parent's evaluation copy, which the parent builds only to evaluate)
TRAINING_KINDS = tuple(k for k in KINDS if k != "snapshot")


def training_difference(cfg: RGCConfig, delay_rule: str = "whole") -> dict[str, int]:
    """Async's tensor bytes minus backprop's by kind (:data:`TRAINING_KINDS`), summed over the
    workers: the account of the training phase, the phase a run's peak is taken from."""
    acc, base = async_account(cfg, delay_rule=delay_rule), backprop_account(cfg)
    return {k: sum(int(w["bytes"][k]) for w in acc["workers"]) - int(base["bytes"][k])
            for k in TRAINING_KINDS}


def explain_excess(cfg: RGCConfig, candidate: dict[str, Any], baseline: dict[str, Any],
                   metric: str = "rss") -> list[dict[str, Any]]:
    """Async's measured excess over backprop (run summaries' training-phase peaks, ``metric``
    ``"rss"`` or ``"pss"``) explained: the account's difference by kind
    (:func:`training_difference`: activations kept, stashed weights, queued activation copies,
    decoder replicas, ...), the workers' torch runtimes (measured by the executor when they had
    started, ``details.worker_runtimes_memory``, in the same metric; else the idle torch
    process's USS per extra process, said so), and the unaccounted rest (allocator, pages
    copied on write, what the account does not know). Rows ``{"what", "bytes"}``; every row but
    the first adds up to the first."""
    check(metric in ("rss", "pss"), "metric", metric, "must be 'rss' or 'pss'")
    key = f"peak_{metric}_bytes"
    for name, s in (("candidate", candidate), ("baseline", baseline)):
        check(s.get(key) is not None, f"{name}.{key}", s.get(key), "must be recorded")
    excess = int(candidate[key]) - int(baseline[key])
    rows: list[dict[str, Any]] = [{"what": "measured excess", "bytes": excess}]
    kinds = training_difference(cfg)
    rows += [{"what": k, "bytes": v} for k, v in kinds.items()]
    measured = (candidate.get("details") or {}).get("worker_runtimes_memory")
    if measured is not None:
        runtimes, what = int(measured[metric]), "torch runtimes of the workers (measured)"
    else:
        extra = int(candidate.get("processes", 1)) + 1 - int(baseline.get("processes", 1))
        idle = int((candidate.get("idle_torch_process") or {}).get("uss", 0))
        runtimes, what = extra * idle, "torch runtimes (idle torch USS x extra processes)"
    rows.append({"what": what, "bytes": runtimes})
    rows.append({"what": "unaccounted rest",
                 "bytes": excess - sum(kinds.values()) - runtimes})
    return rows
