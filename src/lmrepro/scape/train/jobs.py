"""A SCAPE run as one SLURM job (``launcher: kind: slurm``): torchrun on every node of the
job, the c10d rendezvous at the allocation's first node (:mod:`lmrepro.cluster.nodes`), each node
starting ``world_size`` workers of the program ``lmrepro train-scape`` runs
(:mod:`lmrepro.scape.train.worker`). One node: torchrun ``--standalone``, as on this machine, so
a run's numbers are the local run's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmrepro.cluster.jobs import JobSpec, Requeueable
from lmrepro.cluster.nodes import slurm_nodes
from lmrepro.model import ModelConfig
from lmrepro.scape.config import ScapeConfig, ScapeRun
from lmrepro.scape.train.launch import Nodes, launch_train_scape


@dataclass(frozen=True)
class ScapeJob(Requeueable):
    """What one node of a SCAPE run's job does (pickled by submitit, called in the job)."""

    corpus_dir: str
    out: str
    world_size: int
    cfg: ScapeConfig
    run: ScapeRun
    model: ModelConfig
    seed: int
    corpus: str

    def __call__(self) -> None:
        here = slurm_nodes()
        nodes = Nodes() if here.count == 1 else Nodes(here.count, here.rank, here.endpoint)
        launch_train_scape(self.corpus_dir, self.out, self.world_size, self.cfg, self.run,
                           self.model, seed=self.seed, corpus=self.corpus, nodes=nodes)


def scape_job(name: str, corpus_dir: str | Path, out: Path, world_size: int, cfg: ScapeConfig,
              run: ScapeRun, model: ModelConfig, seed: int, corpus: str,
              nodes: int) -> JobSpec:
    """The job of one run: ``nodes`` nodes, each with the cores of its ``world_size`` workers."""
    fn = ScapeJob(str(corpus_dir), str(out), world_size, cfg, run, model, seed, corpus)
    return JobSpec(name, out, fn, nodes=nodes, cpus=world_size * cfg.threads)
