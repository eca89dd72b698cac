"""Raw-gradient top-k sparsification with error feedback over AdamW: the baseline that SCAPE
(arXiv 2607.01678) is measured against.

Each rank ``i`` forms ``a_i = r_i + g_i`` over the full flattened gradient, keeps the ``k =
ceil(rho N)`` coordinates of largest ``|a_i|`` (its own mask: the masks differ between ranks),
and all-gathers its values and indices (two all-gathers; indices encoded as int32 or a bitmap,
whichever is smaller). Every rank then sums the ``p`` sparse contributions into a dense vector,
divides by ``p``, and runs ``torch.optim.AdamW`` on it; the residual keeps what was not sent,
``r_i = a_i`` with the selected coordinates zeroed (Stich et al. 2018; Lin et al. 2018). The
optimizer state is replicated (no sharding), so no parameters are exchanged. Top-k of the raw
gradient feeds Adam a sparse, bursty gradient whose second moment no longer matches its first:
the instability at high sparsity that SCAPE's first-moment mask avoids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .adams import check_hyperparameters
from .comm import (Comm, check_grads, check_params, check_same_size, check_sparsity, decode_mask,
                   encode_mask, encoded_nbytes, flat_to_grads, grads_to_flat, keep_count,
                   mask_encoding, select_topk_sorted, split_named)
from .errors import check


class TopKEF(torch.optim.AdamW):
    """Top-k (by ``|r + g|`` per rank) with error feedback, then AdamW on the mean sparse gradient.

    Call ``loss.backward(); opt.step()`` on every rank (the step is collective). Without an
    initialised process group it runs alone with local collectives.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, sparsity: float = 0.99,
                 process_group: Any = None) -> None:
        check_hyperparameters(lr, betas, eps, weight_decay, prefix="TopKEF")
        check_sparsity(sparsity, "TopKEF")
        tensors, self._names = split_named(params)
        check_params(tensors, self._names, "TopKEF")
        super().__init__(tensors, lr=lr, betas=(betas[0], betas[1]), eps=eps,
                         weight_decay=weight_decay, foreach=False)
        check(len(self.param_groups) == 1, "TopKEF.params", f"{len(self.param_groups)} groups",
              "must be a single parameter group")
        self._params: list[torch.Tensor] = self.param_groups[0]["params"]
        self.sparsity = float(sparsity)
        self.comm = Comm(process_group)
        p0 = self._params[0]
        self.n = sum(p.numel() for p in self._params)
        self.k = keep_count(self.sparsity, self.n)
        self.mask_kind = mask_encoding(self.n, self.k)
        check_same_size(self.comm, [self.n, self.k], p0.device, "TopKEF")
        with torch.no_grad():
            for p in self._params:
                self.comm.broadcast_(p.data)
        self.residual = torch.zeros(self.n, dtype=torch.float32, device=p0.device)
        self._dense = torch.zeros(self.n, dtype=torch.float32, device=p0.device)

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank handed to collectives in the last step, by kind, and ``total``."""
        return self.comm.stats()

    def expected_bytes(self) -> dict[str, int]:
        grad = 4 * self.k
        mask = encoded_nbytes(self.n, self.k)
        return {"grad_values": grad, "param_values": 0, "mask": mask, "total": grad + mask}

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        check_grads(self._params, self._names, "TopKEF")
        comm = self.comm
        comm.begin_step()
        a = self.residual.add_(grads_to_flat(self._params, self._dense))
        idx = select_topk_sorted(a.abs(), self.k)
        vals = a[idx]
        a.index_fill_(0, idx, 0.0)
        all_vals, _ = comm.all_gather(vals, "grad_values")
        all_idx, _ = comm.all_gather(encode_mask(idx, self.n, self.mask_kind), "mask")
        dense = self._dense.zero_()
        idx_parts = all_idx.view(comm.world, -1)
        val_parts = all_vals.view(comm.world, -1)
        for j in range(comm.world):
            dense.index_add_(0, decode_mask(idx_parts[j], self.n, self.mask_kind), val_parts[j])
        dense.div_(comm.world)
        flat_to_grads(dense, self._params)
        super().step()
        comm.end_step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["topk_residual"] = self.residual.clone()
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        residual = state_dict.pop("topk_residual")
        super().load_state_dict(state_dict)
        self.residual.copy_(residual)
