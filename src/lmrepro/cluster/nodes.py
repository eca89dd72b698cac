"""Where a multi-node job's processes meet: read from SLURM's environment inside the job.

Every node of a job runs one task (``--ntasks-per-node 1``); :func:`slurm_nodes` says how many
nodes there are, which one this is, and the c10d rendezvous endpoint: the allocation's first node
at a port derived from the job id (every node computes the same one without talking to the
others; ports 20000-39999, so two jobs sharing a node rarely collide, and a collision fails the
rendezvous at once, loudly, rather than joining the wrong job).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

FIRST_PORT, PORTS = 20000, 20000


@dataclass(frozen=True)
class JobNodes:
    """This job's nodes: how many, this one's rank among them, and the rendezvous endpoint."""

    count: int
    rank: int
    endpoint: str


def rendezvous_port(job_id: str) -> int:
    """The rendezvous port of a job (the same on every node): from its numeric id."""
    digits = "".join(c for c in job_id.split("_")[0] if c.isdigit()) or "0"
    return FIRST_PORT + int(digits) % PORTS


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[01-04]`` -> ``node01``), by ``scontrol``."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=30, check=True)
    return out.stdout.split()[0]


def slurm_nodes(env: Mapping[str, str] | None = None) -> JobNodes:
    """This task's place in its job, from ``SLURM_NNODES``, ``SLURM_NODEID``,
    ``SLURM_JOB_NODELIST`` and the job's id (an array task's own, ``SLURM_JOB_ID``)."""
    env = os.environ if env is None else env
    count = int(env.get("SLURM_NNODES", "1"))
    rank = int(env.get("SLURM_NODEID", "0"))
    host = first_host(env["SLURM_JOB_NODELIST"]) if count > 1 else "localhost"
    return JobNodes(count, rank, f"{host}:{rendezvous_port(env.get('SLURM_JOB_ID', '0'))}")
