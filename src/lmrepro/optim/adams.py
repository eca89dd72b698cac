"""AdamS: Adam-style steps with the memory of SGD with momentum (arXiv 2505.16363).

AdamS keeps a single state buffer, the first moment ``m``. The second moment is not stored: it is
rebuilt every step from the *previous* first moment and the current gradient,

    m_t = b1 * m_{t-1} + (1 - b1) * g_t
    v_t = b2 * m_{t-1}^2 + (1 - b2) * g_t^2
    p_t = p_{t-1} - lr * ( m_t / (sqrt(v_t) + eps) + wd * p_{t-1} )

with no bias correction and decoupled weight decay (``lr * wd * p``), exactly as written in
docs/papers.md. ``bias_correction=True`` divides as Adam does, ``m_t / (1 - b1^t)`` and
``v_t / (1 - b2^t)`` with ``t`` the parameter's step count (the authors of SCAPE run their AdamS
with it: ``optimizer/AdamS.py`` in GitHub ``mz687/SCAPE_SC26``); the default stays the paper's
formula. Because ``v_t`` needs nothing but ``m_{t-1}`` and ``g_t``, a sparse-communication
optimizer (SCAPE, arXiv 2607.01678) can update both moments from the *one* averaged-gradient buffer
it receives, without a second collective; that is why SCAPE is built on AdamS.

Note on the first step: with ``m_0 = 0`` the update is ``(1-b1) g / (sqrt(1-b2) |g| + eps)``,
about ``3.16 * sign(g)`` for the default betas (no bias correction), so use a learning-rate
warm-up, as the paper does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .errors import check


def check_hyperparameters(lr: float, betas: tuple[float, float], eps: float,
                          weight_decay: float, prefix: str = "optimizer") -> None:
    """Validate the AdamS/Adam hyper-parameters with messages that name the parameter."""
    check(isinstance(lr, (int, float)) and lr >= 0.0, f"{prefix}.lr", lr, "must be a number >= 0")
    check(isinstance(betas, (tuple, list)) and len(betas) == 2, f"{prefix}.betas", betas,
          "must be a pair (beta1, beta2)")
    b1, b2 = betas
    check(isinstance(b1, (int, float)) and 0.0 <= b1 < 1.0, f"{prefix}.betas[0]", b1,
          "must be in [0, 1)")
    check(isinstance(b2, (int, float)) and 0.0 <= b2 < 1.0, f"{prefix}.betas[1]", b2,
          "must be in [0, 1)")
    check(isinstance(eps, (int, float)) and eps > 0.0, f"{prefix}.eps", eps, "must be > 0")
    check(isinstance(weight_decay, (int, float)) and weight_decay >= 0.0,
          f"{prefix}.weight_decay", weight_decay, "must be a number >= 0")


def adams_second_moment(m_prev: torch.Tensor, g: torch.Tensor, beta2: float) -> torch.Tensor:
    """``v_t = b2 * m_{t-1}^2 + (1 - b2) * g_t^2`` (AdamS's rebuilt second moment)."""
    return m_prev.square().mul(beta2).add_(g.square(), alpha=1.0 - beta2)


def bias_corrections(step: int, beta1: float, beta2: float, enabled: bool
                     ) -> tuple[float, float]:
    """``(bc1, bc2) = (1 / (1 - b1^t), 1 / sqrt(1 - b2^t))`` for step ``t >= 1`` (``(1, 1)`` when
    disabled): the update is ``m * bc1 / (sqrt(v) * bc2 + eps)`` (docs/scape.md, step 5)."""
    if not enabled:
        return 1.0, 1.0
    return 1.0 / (1.0 - beta1 ** step), 1.0 / math.sqrt(1.0 - beta2 ** step)


def adams_update(p: torch.Tensor, g: torch.Tensor, m_prev: torch.Tensor, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float,
                 bc: tuple[float, float] = (1.0, 1.0)
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamS step on plain tensors; returns new ``(p, m, v)`` and leaves inputs untouched.
    ``bc``: :func:`bias_corrections` (none by default, the paper's formula)."""
    m = m_prev.mul(beta1).add_(g, alpha=1.0 - beta1)
    v = adams_second_moment(m_prev, g, beta2)
    bc1, bc2 = bc
    if bc1 == 1.0 and bc2 == 1.0:
        step = m / v.sqrt().add_(eps)
    else:
        step = (m * bc1) / v.sqrt().mul_(bc2).add_(eps)
    if weight_decay != 0.0:
        step = step.add_(p, alpha=weight_decay)
    return p - lr * step, m, v


class AdamS(torch.optim.Optimizer):
    """AdamS (arXiv 2505.16363): see the module docstring for the exact update.

    State per parameter: ``m`` (the first moment) and the step count. Parameter groups may set
    their own ``lr``, ``weight_decay``, ``betas``, ``eps`` and ``bias_correction``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, bias_correction: bool = False) -> None:
        check_hyperparameters(lr, betas, eps, weight_decay, prefix="AdamS")
        check(isinstance(bias_correction, bool), "AdamS.bias_correction", bias_correction,
              "must be True or False")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamS does not support sparse gradients")
                state = self.state[p]
                if "m" not in state:
                    state["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["step"] = 0
                state["step"] += 1
                bc = bias_corrections(state["step"], b1, b2, group["bias_correction"])
                new_p, new_m, _ = adams_update(p, p.grad, state["m"], group["lr"], b1, b2,
                                               group["eps"], group["weight_decay"], bc)
                p.copy_(new_p)
                state["m"].copy_(new_m)
        return loss
