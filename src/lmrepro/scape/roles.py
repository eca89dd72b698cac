"""The SCAPE wing's roles in the analysis (each the summary's ``method``), declared to the
pipeline by :mod:`lmrepro.scape.wing`."""

import enum


class ScapeMethod(enum.StrEnum):
    """The SCAPE wing's methods, as ``RunSummary.method`` records them (each is its own role)."""

    ADAMW = "adamw"            # data-parallel dense AdamW (SCAPE's dense baseline)
    ADAMS = "adams"            # data-parallel dense AdamS
    SCAPE = "scape"            # SCAPE (sparse AdamS, the authors' error-feedback momentum rule)
    SCAPE_STALE_M = "scape_stale_m"   # SCAPE with the stale-|m| mask rule (an ablation)
    TOPK = "topk"              # raw-gradient top-k with error feedback on AdamS (SCAPE's foil)
    TOPK_ADAMW = "topk_adamw"  # the same top-k on AdamW


ROLE_ADAMW = "adamw"                # data-parallel dense AdamW (SCAPE's dense baseline)
ROLE_ADAMS = "adams"                # data-parallel dense AdamS
ROLE_SCAPE = "scape"
ROLE_TOPK = "topk"                  # top-k with error feedback on AdamS (the paper's foil)
ROLE_SCAPE_STALE_M = "scape_stale_m"  # SCAPE with the stale-|m| mask rule (our ablation)
ROLE_TOPK_ADAMW = "topk_adamw"      # top-k with error feedback on AdamW
#: the sparse-communication roles (a label shows their sparsity)
SPARSE = (ROLE_SCAPE, ROLE_SCAPE_STALE_M, ROLE_TOPK, ROLE_TOPK_ADAMW)
#: every role of the wing: data-parallel replicas (their count is the world size)
DATA_PARALLEL = (ROLE_ADAMW, ROLE_ADAMS, *SPARSE)
