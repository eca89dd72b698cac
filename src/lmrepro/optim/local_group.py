"""An in-process group of ``world`` simulated data-parallel workers, for :class:`.comm.Comm`.

Each worker is a thread of one process holding its own model replica and optimizer; the
optimizers' collectives meet here instead of in ``torch.distributed``. It exists so that a study
of many workers (16 on 2 cores) trains the optimizers' own code without 16 processes and a gloo
ring competing for two cores: the arithmetic each worker does is the optimizer's, only the
transport differs. A sum is taken in rank order (gloo's ring may add in another order: results
agree to fp32 rounding, not bit for bit beyond two workers); gathers and broadcasts are exact.

Every member must call the same collectives in the same order (as with ``torch.distributed``).
A collective is two barrier phases: each member posts its tensor, member 0 combines the posts,
then every member reads the result. Posts and results are double-buffered by the collective's
parity, so a member at most one collective ahead never overwrites what a slower one still
reads. A member that fails calls :meth:`LocalGroup.abort`: the others' waits then raise
``threading.BrokenBarrierError`` instead of hanging; a wait longer than ``timeout_s`` raises too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .errors import check

__all__ = ["LocalGroup", "LocalMember"]


class _Done:
    """The handle of a finished collective (an in-process collective completes at once)."""

    def wait(self) -> bool:
        return True


DONE = _Done()


class LocalGroup:
    """The shared meeting point of ``world`` members (threads of this process)."""

    def __init__(self, world: int, timeout_s: float = 120.0) -> None:
        check(isinstance(world, int) and world >= 1, "world", world, "must be an integer >= 1")
        check(timeout_s > 0, "timeout_s", timeout_s, "must be > 0 seconds")
        self.world = world
        self._barrier = threading.Barrier(world, timeout=timeout_s)
        self._posts: list[list[Any]] = [[None] * world, [None] * world]
        self._results: list[Any] = [None, None]

    def members(self) -> list[LocalMember]:
        """One handle per rank, to pass as an optimizer's ``process_group``."""
        return [LocalMember(self, r) for r in range(self.world)]

    def abort(self) -> None:
        """Break every pending and future wait (a member failed)."""
        self._barrier.abort()

    def exchange(self, rank: int, count: int, value: Any,
                 combine: Callable[[list[Any]], Any]) -> Any:
        """Post ``value`` as member ``rank`` of collective number ``count``; member 0 combines
        every post in rank order; returns the combination (the same object for every member)."""
        slot = count % 2
        self._posts[slot][rank] = value
        self._barrier.wait()
        if rank == 0:
            self._results[slot] = combine(self._posts[slot])
        self._barrier.wait()
        return self._results[slot]


def _sum_in_rank_order(posts: list[torch.Tensor]) -> torch.Tensor:
    out = posts[0].clone()
    for t in posts[1:]:
        out.add_(t)
    return out


class LocalMember:
    """Rank ``rank`` of a :class:`LocalGroup`: the collectives :class:`.comm.Comm` calls."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        check(0 <= rank < group.world, "rank", rank, f"must be in [0, {group.world - 1}]")
        self.group, self.rank, self.world = group, rank, group.world
        self._count = 0

    def _exchange(self, value: Any, combine: Callable[[list[Any]], Any]) -> Any:
        try:
            got = self.group.exchange(self.rank, self._count, value, combine)
        except BaseException:
            self.group.abort()
            raise
        self._count += 1
        return got

    def all_reduce_(self, t: torch.Tensor) -> None:
        """Sum ``t`` over the members in place (in rank order)."""
        t.copy_(self._exchange(t, _sum_in_rank_order))

    def all_gather(self, inp: torch.Tensor) -> torch.Tensor:
        """Every member's ``inp`` (equal sizes) concatenated in rank order (a copy of its own)."""
        return self._exchange(inp.reshape(-1), torch.cat).clone()

    def broadcast_(self, t: torch.Tensor, src_rank: int = 0) -> None:
        """Copy member ``src_rank``'s ``t`` into every member's ``t``."""
        got = self._exchange(t, lambda posts: posts[src_rank].clone())
        if self.rank != src_rank:
            t.copy_(got)
