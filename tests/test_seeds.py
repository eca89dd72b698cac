"""How a run's seed becomes its random streams (lmrepro.seeds)."""

from __future__ import annotations

import torch

from lmrepro import seeds


def _draw(gen: torch.Generator) -> list[int]:
    return torch.randint(0, 1 << 30, (4,), generator=gen).tolist()


def test_derived_batch_streams_are_apart_from_their_run_and_from_each_other() -> None:
    """The offset derivation gives a batch stream no initialisation seed in use has; the
    per-rank one gives every rank of every seed its own stream, none its own run's
    initialisation; the same seed gives the same stream."""
    in_use = range(0, 2000)
    offset = {seeds.BATCH_OFFSET + s for s in in_use}
    ranked = {(s, r): s * seeds.BATCH_OFFSET + seeds.RANK_STRIDE * r + 1
              for s in in_use for r in range(64)}
    assert len(set(ranked.values())) == len(ranked)
    assert not offset & set(in_use) and all(v != s for (s, _), v in ranked.items())
    assert _draw(seeds.batches_offset(3)) == _draw(seeds.batches_offset(3))
    assert _draw(seeds.batches_offset(3)) != _draw(seeds.batches_same_seed(3))
    assert _draw(seeds.batches_of_rank(3, 0)) != _draw(seeds.batches_of_rank(3, 1))
    torch.manual_seed(123)
    seeds.seed_init(5)
    a = torch.rand(3)
    seeds.seed_init(5)
    assert torch.equal(a, torch.rand(3))


def test_the_derivations_are_the_streams_published_runs_were_trained_on() -> None:
    """Pinned first draws: a change to a derivation changes every published run's batches, so
    it must fail here first (the figures were recorded once, from these formulas)."""
    got = {"same": _draw(seeds.batches_same_seed(0)), "offset": _draw(seeds.batches_offset(0)),
           "rank1": _draw(seeds.batches_of_rank(0, 1))}
    want = {"same": _draw(torch.Generator().manual_seed(0)),
            "offset": _draw(torch.Generator().manual_seed(1_000_003)),
            "rank1": _draw(torch.Generator().manual_seed(7920))}
    assert got == want
