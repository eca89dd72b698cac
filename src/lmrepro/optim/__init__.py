"""Optimizers: AdamS (arXiv 2505.16363), SCAPE (arXiv 2607.01678), the top-k + error-feedback
baseline, and the dense data-parallel wrapper used for the AdamW / AdamS baselines.

A standalone library: it imports torch and nothing else of ``lmrepro`` (relative imports only),
so it can be used, tested and type-checked on its own. Names are imported lazily, so the rest of
the package can use :mod:`~lmrepro.optim.errors` without loading every optimizer.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "AdamS": "adams", "adams_update": "adams", "DenseDP": "comm", "MASK_RULES": "scape_layout",
    "NonFiniteGradientError": "errors", "ParameterError": "errors", "SCAPE": "scape",
    "TopKEF": "topk", "sparsity_at": "scape_layout", "weight_decay_groups": "groups",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
