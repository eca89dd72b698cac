"""An RGC run as one SLURM job (``launcher: kind: slurm``): one node, the cores its executor's
placement uses (the async workers' threads together; sync and backprop their threads), the run
trained in the job's own process by :func:`lmrepro.rgc.executors.runner.train` (a fresh process
already: the same numbers as a local run's fresh process)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmrepro.cluster.jobs import JobSpec, Requeueable
from lmrepro.data.prepare import load_split
from lmrepro.rgc.config import MULTI_PROCESS, RGCConfig


@dataclass(frozen=True)
class RGCJob(Requeueable):
    """What an RGC run's job does (pickled by submitit, called in the job): load the corpus's
    splits, train or resume the run."""

    config: RGCConfig
    executor: str
    corpus_dir: str
    corpus: str
    run_dir: str
    name: str
    seed: int

    def __call__(self) -> None:
        from lmrepro.rgc.executors.runner import train

        splits = {s: load_split(self.corpus_dir, s) for s in ("train", "val", "test")}
        train(self.config, self.executor, splits["train"], splits["val"], self.run_dir,
              self.corpus, self.name, seed=self.seed, test_data=splits["test"])


def cores_of(config: RGCConfig, executor: str) -> int:
    """The cores a run of ``executor`` uses: every async worker's threads, else the single
    process's."""
    return (config.async_threads if executor in MULTI_PROCESS
            else config.single_process_threads)


def rgc_job(label: str, config: RGCConfig, executor: str, corpus_dir: Path, corpus: str,
            run_dir: Path, name: str, seed: int) -> JobSpec:
    """The one-node job of one run."""
    fn = RGCJob(config, executor, str(corpus_dir), corpus, str(run_dir), name, seed)
    return JobSpec(label, run_dir, fn, nodes=1, cpus=cores_of(config, executor))
