"""Optimizers: AdamS (arXiv 2505.16363), SCAPE (arXiv 2607.01678), the top-k + error-feedback
baseline, and the dense data-parallel wrapper used for the AdamW / AdamS baselines.

A standalone library: it imports torch and nothing else of ``lmrepro`` (relative imports only),
so it can be used, tested and type-checked on its own.
"""

from .adams import AdamS, adams_update
from .comm import DenseDP
from .errors import ParameterError
from .groups import weight_decay_groups
from .scape import MASK_SCORES, SCAPE
from .topk import TopKEF

__all__ = ["AdamS", "adams_update", "DenseDP", "MASK_SCORES", "ParameterError", "SCAPE",
           "TopKEF", "weight_decay_groups"]
