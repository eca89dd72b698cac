"""Optimizers: AdamS (arXiv 2505.16363), SCAPE (arXiv 2607.01678), the top-k + error-feedback
baseline, and the dense data-parallel wrapper used for the AdamW / AdamS baselines."""

from lmrepro.optim.adams import AdamS, adams_update
from lmrepro.optim.comm import DenseDP
from lmrepro.optim.scape import MASK_SCORES, SCAPE
from lmrepro.optim.topk import TopKEF

__all__ = ["AdamS", "adams_update", "DenseDP", "SCAPE", "MASK_SCORES", "TopKEF"]
