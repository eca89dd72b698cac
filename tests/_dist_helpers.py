"""Helpers for the multi-process tests: gloo workers on 127.0.0.1, tiny corpora, and plain
reference implementations written independently of lmrepro.optim (the tests compare against
them)."""

from __future__ import annotations

import datetime
import math
import multiprocessing as mp
import os
import queue
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lmrepro.distributed import free_port


def _entry(fn: Callable, rank: int, world: int, port: int, q: Any, args: tuple,
           timeout_s: float, init_pg: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        if init_pg:
            dist.init_process_group("gloo", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        q.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        q.put((rank, "err", traceback.format_exc()))
    finally:
        if init_pg and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def run_workers(fn: Callable, world: int, *args: Any, timeout: float = 100.0,
                pg_timeout_s: float = 30.0, init_pg: bool = True,
                expect: list[int] | None = None) -> dict[int, Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes joined by a gloo group;
    return ``{rank: result}`` for the ranks in ``expect`` (default all); raise AssertionError with
    the workers' tracebacks on failure."""
    expect = list(range(world)) if expect is None else expect
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, q, args, pg_timeout_s,
                                               init_pg), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(len(expect)):
            rank, status, value = q.get(timeout=timeout)
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"--- rank {rank} ---\n{value}")
    except queue.Empty:
        errors.append(f"timed out after {timeout} s waiting for workers")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("worker failure:\n" + "\n".join(errors))
    return results


def rank_grads(step: int, rank: int, shapes: list[tuple[int, ...]], scale: float = 1.0
               ) -> list[torch.Tensor]:
    """Deterministic per-(step, rank) gradients any process can recompute."""
    g = torch.Generator().manual_seed(10_000 * step + rank + 1)
    return [torch.randn(s, generator=g) * scale for s in shapes]


def make_params(shapes: list[tuple[int, ...]], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_(True) for s in shapes]


def flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in ts])


def owners_by_numel(numels: list[int], world: int) -> list[int]:
    """Contiguous, numel-balanced ownership as the SCAPE authors' reducer assigns it, written
    out plainly: walk the tensors in order; the current owner hands over once it holds at least
    total/world coordinates while more tensors than remaining owners are left, or as soon as only
    as many tensors as remaining owners are left."""
    total = sum(numels)
    out, owner, held = [], 0, 0
    for i, n in enumerate(numels):
        out.append(owner)
        held += n
        tensors_left = len(numels) - 1 - i
        owners_left = world - 1 - owner
        if owners_left > 0 and ((held >= total / world and tensors_left > owners_left)
                                or tensors_left <= owners_left):
            owner += 1
            held = 0
    return out


class ReferenceSCAPE:
    """A plain single-process simulation of ``world`` SCAPE workers (docs/scape.md, "The algorithm
    algorithm (revised)", steps 1-6, with the options of the authors' code), on one flat vector
    per worker. Shares no code with lmrepro.optim.

    ``shapes`` are the tensors in the optimizer's flat order; ``groups[i]`` is the parameter
    group of tensor ``i`` and ``group_hp[g] = (lr, weight_decay)``."""

    def __init__(self, p0: torch.Tensor, shapes: list[tuple[int, ...]], groups: list[int],
                 group_hp: list[tuple[float, float]], world: int, density: float,
                 betas: tuple[float, float], eps: float, *, dense_steps: int = 0,
                 density_start: float = 1.0, warmup: int = 0, exclude_1d: bool = True,
                 bias_correction: bool = True, max_grad_norm: float | None = None) -> None:
        self.p = p0.clone()
        self.n = p0.numel()
        self.world = world
        self.m = torch.zeros(self.n)
        self.r = [torch.zeros(self.n) for _ in range(world)]
        self.mask: torch.Tensor | None = None      # bool, the mask of the next step
        self.t = 0
        self.b1, self.b2 = betas
        self.eps = eps
        self.target, self.dense_steps, self.start, self.warmup = (density, dense_steps,
                                                                  density_start, warmup)
        self.bias_correction, self.max_grad_norm = bias_correction, max_grad_norm
        self.tensors = []       # (offset, numel, excluded)
        off = 0
        for s in shapes:
            n = math.prod(s)
            self.tensors.append((off, n, exclude_1d and len(s) <= 1))
            off += n
        sparse = [n for _, n, ex in self.tensors if not ex]
        it = iter(owners_by_numel(sparse, world))
        self.owner = [None if ex else next(it) for _, _, ex in self.tensors]
        self.lr = torch.zeros(self.n)
        self.wd = torch.zeros(self.n)
        for (o, n, _), g in zip(self.tensors, groups):
            self.lr[o:o + n] = group_hp[g][0]
            self.wd[o:o + n] = group_hp[g][1]

    def density(self, t: int) -> float:
        if t < self.dense_steps:
            return 1.0
        tau = t - self.dense_steps
        if self.warmup > 0 and tau < self.warmup:
            return self.start + (self.target - self.start) * tau / self.warmup
        return self.target

    def _choose(self, cs: list[torch.Tensor], d: float) -> torch.Tensor:
        mask = torch.zeros(self.n, dtype=torch.bool)
        for (o, n, ex), owner in zip(self.tensors, self.owner):
            if ex:
                mask[o:o + n] = True
                continue
            k = min(n, max(1, math.ceil(round(d * n, 6))))
            top = torch.topk(cs[owner][o:o + n].abs(), k).indices
            mask[o + top] = True
        return mask

    def step(self, grads: list[torch.Tensor], lr_scale: float = 1.0) -> torch.Tensor:
        """``grads[i]``: worker i's flat gradient. Returns the mask used (bool)."""
        b1, b2 = self.b1, self.b2
        d, d_next = self.density(self.t), self.density(self.t + 1)
        cs = [b1 * self.m + (1 - b1) * g + r for g, r in zip(grads, self.r)]
        if d >= 1.0:
            mask = torch.ones(self.n, dtype=torch.bool)
        elif self.mask is None:
            mask = self._choose(cs, d)             # bootstrap from the owners' c
        else:
            mask = self.mask
        total = cs[0].clone()
        for c in cs[1:]:
            total = total + c
        mean = total / self.world
        m_new = torch.where(mask, mean, torch.zeros(()))
        self.r = [torch.where(mask, torch.zeros(()), c) for c in cs]
        gt = torch.where(mask, (m_new - b1 * self.m) / (1 - b1), torch.zeros(()))
        if self.max_grad_norm is not None:
            norm = gt.double().norm().item()
            coef = self.max_grad_norm / (norm + 1e-6)
            if coef < 1:
                gt = gt * coef
                m_new = torch.where(mask, b1 * self.m + (1 - b1) * gt, torch.zeros(()))
        v = b2 * self.m ** 2 + (1 - b2) * gt ** 2
        step = self.t + 1
        bc1 = 1 / (1 - b1 ** step) if self.bias_correction else 1.0
        bc2 = 1 / math.sqrt(1 - b2 ** step) if self.bias_correction else 1.0
        u = m_new * bc1 / (torch.sqrt(v) * bc2 + self.eps)
        lr = self.lr * lr_scale
        self.p = self.p - lr * (u + self.wd * self.p)
        self.mask = self._choose(cs, d_next) if d_next < 1.0 else None
        self.m = m_new
        self.t += 1
        return mask

    @property
    def params(self) -> torch.Tensor:
        return self.p


def write_tiny_corpus(root: str | os.PathLike, n_words: int = 40_000, seed: int = 0) -> str:
    """A prepared corpus (train/val/test + manifest) of a tiny word language."""
    from lmrepro.data.prepare import prepare_corpus

    root = str(root)
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = [b"the ", b"cat ", b"sat ", b"on ", b"a ", b"mat. ", b"and ", b"dog ", b"ran\n"]
    raw = os.path.join(root, "raw.txt")
    with open(raw, "wb") as fh:
        fh.write(b"".join(words[i] for i in rng.integers(0, len(words), n_words)))
    out = os.path.join(root, "corpus")
    prepare_corpus(raw, out, split_fractions=[0.8, 0.1, 0.1])
    return out
