"""What the SCAPE wing registers with the pipeline (:mod:`lmrepro.pipeline.registry`): its roles
(the dense baselines and the sparse methods), which are judged against which, the reference
roles of the ``scape`` analysis, the ``scape:`` section of the parameter file and its claims."""

from __future__ import annotations

from lmrepro.pipeline.registry import (Role, register_claims, register_pairings, register_roles,
                                       register_section, register_stage)
from lmrepro.scape.roles import (ROLE_ADAMS, ROLE_ADAMW, ROLE_SCAPE, ROLE_SCAPE_STALE_M,
                                 ROLE_TOPK, ROLE_TOPK_ADAMW, SPARSE)

WING = "scape"

register_roles(WING, *(Role(name, name, data_parallel=True, sparse=name in SPARSE)
                       for name in (ROLE_ADAMW, ROLE_ADAMS, ROLE_SCAPE, ROLE_SCAPE_STALE_M,
                                    ROLE_TOPK, ROLE_TOPK_ADAMW)))
# docs/statistics.md: "The same test judges SCAPE vs dense AdamW/AdamS"
register_pairings(WING, (
    (ROLE_SCAPE, ROLE_ADAMW), (ROLE_SCAPE, ROLE_ADAMS),
    (ROLE_SCAPE_STALE_M, ROLE_ADAMW), (ROLE_SCAPE_STALE_M, ROLE_ADAMS),
    (ROLE_TOPK, ROLE_ADAMW), (ROLE_TOPK, ROLE_ADAMS), (ROLE_TOPK_ADAMW, ROLE_ADAMW)))
register_stage("scape", ROLE_ADAMW, ROLE_ADAMS)
register_section(WING, "scape", "lmrepro.scape.config:ScapeSuite",
                 lambda s: [("scape.corpus", s.corpus)])
register_claims(WING, "lmrepro.scape.claims")
