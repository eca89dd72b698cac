"""The one weight-decay grouping rule of the package (every trainer, every optimizer).

Decoupled weight decay (Loshchilov & Hutter 2019) applies to matrices only: parameters with
fewer than 2 dimensions (biases, LayerNorm/RMSNorm gains) and embedding tables are put in a group
with ``weight_decay = 0``, as is usual for transformer language models (GPT-2/nanoGPT-style
recipes exclude norms and biases; we add the embeddings). A tied output projection is
the embedding table, so it is not decayed either.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def weight_decay_groups(module: torch.nn.Module, weight_decay: float,
                        params: Iterable[torch.nn.Parameter] | None = None
                        ) -> list[dict[str, Any]]:
    """``[{"params": decayed, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]``.

    ``params`` restricts the groups to a subset of ``module``'s parameters (e.g. one pipeline
    stage); order follows ``module.named_parameters()``. Empty groups are left out, and every
    parameter carries its ``name`` list under ``"names"`` for clearer error messages.
    """
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    wanted = None if params is None else {id(p) for p in params}
    decay: list[tuple[str, torch.nn.Parameter]] = []
    no_decay: list[tuple[str, torch.nn.Parameter]] = []
    for name, p in module.named_parameters():
        if wanted is not None and id(p) not in wanted:
            continue
        (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append((name, p))
    groups = [{"params": [p for _, p in g], "names": [n for n, _ in g], "weight_decay": wd}
              for g, wd in ((decay, float(weight_decay)), (no_decay, 0.0)) if g]
    return groups
