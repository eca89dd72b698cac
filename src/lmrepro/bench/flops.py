"""FLOP counting and model FLOP utilisation (MFU).

Conventions: a multiply-add is 2 FLOPs; an ``(m, k) @ (k, n)`` matmul is ``2 m k n``. Training
FLOPs per token of the byte transformer come from :func:`lmrepro.model.train_flops_per_token`
(``6 x`` matmul parameters plus attention, Kaplan et al. 2020); :func:`counted_train_flops`
cross-checks it with torch's own operator-level counter.
"""

from __future__ import annotations

from typing import Any


def matmul_flops(m: int, k: int, n: int, batch: int = 1) -> float:
    """FLOPs of ``batch`` matmuls ``(m, k) @ (k, n)``: ``2 * batch * m * k * n``."""
    if min(m, k, n, batch) < 1:
        raise ValueError("matmul dimensions must be >= 1")
    return 2.0 * batch * m * k * n


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops_per_s: float) -> float:
    """Model FLOP utilisation: achieved model FLOP/s divided by the peak FLOP/s."""
    if peak_flops_per_s <= 0:
        raise ValueError("peak FLOP/s must be > 0")
    return tokens_per_s * flops_per_token / peak_flops_per_s


def model_matmul_shapes(d_model: int, mlp_ratio: int, tokens: int, vocab: int = 256
                        ) -> dict[str, tuple[int, int, int]]:
    """``(m, k, n)`` of the forward matmuls of one transformer block and the readout, with
    ``m = tokens`` (batch x context): the shapes a matmul microbenchmark should also cover."""
    d, h = d_model, mlp_ratio * d_model
    return {"qkv": (tokens, d, 3 * d), "attn_proj": (tokens, d, d), "mlp_up": (tokens, d, h),
            "mlp_down": (tokens, h, d), "readout": (tokens, d, vocab)}


def counted_train_flops(model: Any, x: Any, y: Any) -> float:
    """FLOPs of one forward + backward of ``lm_loss(model(x), y)`` as counted by
    :class:`torch.utils.flop_counter.FlopCounterMode` (matmuls and attention only)."""
    from torch.utils.flop_counter import FlopCounterMode

    from lmrepro.model import lm_loss

    with FlopCounterMode(display=False) as counter:
        lm_loss(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())
