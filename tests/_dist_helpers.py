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


class ReferenceSCAPE:
    """A straightforward single-process simulation of ``world`` SCAPE workers on dense vectors
    (DESIGN.md steps 1-6), sharing no code with lmrepro.optim."""

    def __init__(self, p0: torch.Tensor, world: int, sparsity: float, lr: float,
                 betas: tuple[float, float], eps: float, wd: float) -> None:
        self.n = p0.numel()
        self.world = world
        self.shard = math.ceil(self.n / world)
        self.n_pad = self.shard * world
        self.k = max(1, min(self.shard, math.ceil(round((1 - sparsity) * self.shard, 6))))
        self.p = torch.zeros(self.n_pad)
        self.p[:self.n] = p0
        self.m = torch.zeros(self.n_pad)
        self.r = torch.zeros(world, self.n_pad)
        self.mask: torch.Tensor | None = None
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, betas[0], betas[1], eps, wd

    def step(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """``grads[r]`` flat (n,) for each worker; returns the mask used this step."""
        g = torch.zeros(self.world, self.n_pad)
        for r in range(self.world):
            g[r, :self.n] = grads[r]
        a = self.r + g
        mask = torch.arange(self.n_pad) if self.mask is None else self.mask
        total = a[0, mask].clone()
        for r in range(1, self.world):
            total = total + a[r, mask]
        gbar = total / self.world
        self.r = a.clone()
        self.r[:, mask] = 0.0
        m_prev = self.m[mask]
        m_new = self.b1 * m_prev + (1 - self.b1) * gbar
        v_new = self.b2 * m_prev ** 2 + (1 - self.b2) * gbar ** 2
        p_prev = self.p[mask]
        self.p[mask] = p_prev - self.lr * (m_new / (torch.sqrt(v_new) + self.eps)
                                           + self.wd * p_prev)
        self.m[mask] = m_new
        if self.k < self.shard:
            parts = []
            for j in range(self.world):
                score = self.m[j * self.shard:(j + 1) * self.shard].abs().clone()
                real = max(0, min(self.shard, self.n - j * self.shard))
                score[real:] = -float("inf")
                idx = torch.topk(score, self.k).indices.sort().values + j * self.shard
                parts.append(idx)
            self.mask = torch.cat(parts)
        return mask

    @property
    def params(self) -> torch.Tensor:
        return self.p[:self.n]


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
