"""Peak memory of a process tree (lmrepro.memory): children count, as RSS, PSS and USS."""

from __future__ import annotations

import subprocess
import sys

from lmrepro.memory import Memory, MemorySampler, idle_torch_process

MIB = 2**20


def test_peak_counts_child_processes_as_rss_pss_and_uss() -> None:
    sampler = MemorySampler(interval_s=0.02)
    own = sampler.sample()  # this process tree (multiprocessing helpers excluded)
    with sampler:
        child = subprocess.Popen([sys.executable, "-c",
                                  "import time; b = b'x' * (200 * 2**20); time.sleep(1.5)"])
        child.wait(timeout=60)
    assert sampler.peak_bytes >= own.rss + 150 * MIB
    # the child's 200 MiB are its own pages: they count in PSS and USS as well
    assert sampler.peak.pss >= own.pss + 150 * MIB and sampler.peak.uss >= own.uss + 150 * MIB
    assert sampler.samples > 5
    # a worker measured alone (children=False) does not see the child
    alone = MemorySampler(children=False)
    assert alone.sample().rss < own.rss + 150 * MIB


def test_idle_torch_process_is_a_runtime_sized_footprint() -> None:
    idle = idle_torch_process()
    assert set(idle) == {"rss", "pss", "uss"}
    # torch's libraries are tens of MiB at least; USS <= PSS <= RSS by definition
    assert idle["rss"] > 50 * MIB and 0 < idle["uss"] <= idle["pss"] <= idle["rss"]
    assert Memory(1, 2, 3) + Memory(1, 1, 1) == Memory(2, 3, 4)
