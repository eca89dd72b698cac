"""The fault points of the async stage workers (tests only): their names and the check that an
armed one can fire in the run at hand."""

from __future__ import annotations

import re

from lmrepro.errors import check
from lmrepro.lifetime import FAULT_ENV, armed_fault
from lmrepro.rgc.config import RGCConfig


#: the fault points of an async stage worker (:func:`lmrepro.lifetime.fault_point`, tests only):
#: ``rgc-stage<k>@<step>`` at the start of a step, ``rgc-stage<k>-backward@<step>`` before stage
#: k's backward of the step's first micro-batch (H > 1); with ``-mislabel``
#: (:func:`lmrepro.lifetime.fault_armed`: a wrong value, not a failure) stage k tags the
#: activations (``rgc-stage<k>-mislabel@<step>``) or gradients
#: (``rgc-stage<k>-backward-mislabel@<step>``) it sends at that step with the next step
FAULT_POINT = re.compile(r"rgc-stage(\d+)(-backward)?(-mislabel)?@(\d+)")


def stage_fault_point(stage: int, step: int, backward: bool = False, mislabel: bool = False
                      ) -> str:
    """The name of stage ``stage``'s fault point at ``step`` (:data:`FAULT_POINT`)."""
    return (f"rgc-stage{stage}{'-backward' if backward else ''}{'-mislabel' if mislabel else ''}"
            f"@{step}")


def check_fault_point(config: RGCConfig, executor: str) -> None:
    """Refuse an RGC fault point a test armed (:func:`armed_fault`) that cannot fire here."""
    armed = armed_fault()
    if armed is None or not armed[0].startswith("rgc-"):
        return
    point = armed[0]
    match = FAULT_POINT.fullmatch(point)
    if match is None:
        check(False, FAULT_ENV, point, "an RGC fault point is rgc-stage<k>@<step>, "
              "rgc-stage<k>-backward@<step>, rgc-stage<k>-mislabel@<step> or "
              "rgc-stage<k>-backward-mislabel@<step>")
        return
    check(executor == "async", FAULT_ENV, point,
          "fault injection exists only for executor='async'")
    k = int(match[1])
    check(k < config.n_stages, FAULT_ENV, point,
          f"a fault point of a stage in [0, {config.n_stages})")
    check(not match[2] or config.horizon > 1, FAULT_ENV, point,
          "a backward-phase fault needs rgc.horizon > 1 (with H = 1 no gradient crosses "
          "workers)")
    if match[3]:
        senders = ([ws[0] for ws in config.placement[1:]] if match[2]
                   else [ws[-1] for ws in config.placement[:-1]])
        check(k in senders, FAULT_ENV, point, f"a mislabel fault of a stage that sends "
              f"{'gradients' if match[2] else 'activations'} to another worker: one of "
              f"{senders}")
