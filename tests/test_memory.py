"""Peak memory of a process tree (lmrepro.memory): children count, as RSS, PSS and USS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lmrepro.memory import Memory, MemorySampler, RunCgroup, idle_torch_process, status_memory

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


# -- exact peaks: high-water marks and the cgroup peak ---------------------------------------

_BURST = ("import sys, time\n"
          "sys.stdin.readline()\n"
          "b = bytearray(200 * 2**20)\n"          # 200 MiB, touched (zeroed by the kernel: use it)
          "b[::4096] = b'x' * len(b[::4096])\n"
          "del b\n"                               # freed before the sampler looks again
          "print('freed', flush=True)\n"
          "time.sleep(float(sys.argv[1]))\n")


def test_high_water_mark_sees_a_burst_between_samples() -> None:
    """A child allocates 200 MiB and frees it between two samples: the sampled RSS misses it,
    the child's VmHWM (read when it was seen and again at the end) does not."""
    sampler = MemorySampler(interval_s=60.0, full_interval_s=60.0)   # no tick during the test
    own = sampler.sample()
    with sampler:
        child = subprocess.Popen([sys.executable, "-c", _BURST, "30"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            sampler.sample()                         # the tree is listed: the child is seen
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "freed"
        finally:
            sampler.stop()                           # reads every seen process's VmHWM again
            child.kill()
            child.wait(timeout=60)
    exact = sampler.exact()
    assert sampler.peak.rss < own.rss + 150 * MIB                     # sampling missed it
    assert exact["hwm_by_process"][str(child.pid)] >= 200 * MIB       # the mark did not
    assert exact["hwm_sum_bytes"] >= own.rss + 200 * MIB
    assert exact["hwm_sum_bytes"] >= sampler.peak.rss                 # an upper bound
    assert exact["cgroup"]["source"] is None and exact["cgroup"]["unavailable_because"]


_REAPED = f"""
import json, subprocess, sys
from lmrepro.memory import MemorySampler
with MemorySampler(interval_s=60.0, full_interval_s=60.0) as sampler:
    child = subprocess.Popen([sys.executable, "-c", {_BURST!r}, "0"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, text=True)
    child.communicate("go\\n", timeout=60)              # reaped here
print(json.dumps({{"child": child.pid, "rss": sampler.peak.rss, "exact": sampler.exact()}}))
"""


def test_a_child_that_exits_before_any_sample_counts_through_its_rusage() -> None:
    """Started, grown to 200 MiB and gone within one sampling interval: never listed, it is
    still in the high-water figure (the kernel's peak RSS of reaped children). Run in a fresh
    interpreter: the kernel's figure is the largest child ever reaped by the process."""
    import json

    out = subprocess.run([sys.executable, "-c", _REAPED], capture_output=True, text=True,
                         timeout=120, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    exact = r["exact"]
    assert str(r["child"]) not in exact["hwm_by_process"]          # never sampled
    assert r["rss"] < 150 * MIB + min(exact["hwm_by_process"].values())
    assert exact["reaped_children_max_rss_bytes"] >= 200 * MIB
    assert exact["hwm_sum_bytes"] >= 200 * MIB + sum(exact["hwm_by_process"].values())


def test_status_memory_reads_rss_and_high_water_mark() -> None:
    import os

    rss, hwm = status_memory(os.getpid()) or (0, 0)
    assert 0 < rss <= hwm
    assert status_memory(2**22 + 12345) is None        # no such process


def test_cgroup_peak_of_a_child_placed_in_a_run_cgroup() -> None:
    """Where a child memory cgroup can be made (root, a memory controller), its peak sees the
    child's 200 MiB burst though the child was never sampled; elsewhere it says why not."""
    cg = RunCgroup("lmrepro-test")
    if not cg.available:
        assert cg.reason and cg.info()["peak_bytes"] is None
        pytest.skip(f"no per-run memory cgroup here: {cg.reason}")
    with cg, MemorySampler(interval_s=60.0, full_interval_s=60.0, cgroup=cg) as sampler:
        child = subprocess.Popen([sys.executable, "-c", _BURST, "0"], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, text=True)
        cg.add(child.pid)
        child.communicate("go\n", timeout=60)
    info = sampler.exact()["cgroup"]
    assert info["source"] in (RunCgroup.V1, RunCgroup.V2)
    assert info["peak_bytes"] >= 200 * MIB and info["unavailable_because"] is None
    assert cg.path is None                                # removed on exit
