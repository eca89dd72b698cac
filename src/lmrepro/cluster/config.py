"""The ``launcher:`` section of ``params.yaml``: where a stage's runs execute.

``kind: local`` (the default) trains every run on the machine that runs the stage, one after
another, as always. ``kind: slurm`` submits every independent run of a SCAPE or RGC suite as a
SLURM job through submitit (:mod:`lmrepro.cluster.jobs`); the ``slurm:`` subsection says where
and with what. The launcher never changes a run's numbers, so it is no part of any run's
identity and no stage's DVC parameters: switching it reuses finished runs.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from lmrepro.config import Section, field_error


class SlurmConfig(Section):
    """What every job of a stage asks SLURM for (``sbatch`` options, through submitit)."""

    key: ClassVar[str] = "launcher.slurm"

    partition: str | None = Field(default=None, description="the partition jobs go to "
                                  "(sbatch --partition); required with kind: slurm")
    nodes: int = Field(default=1, ge=1, description="nodes per multi-node run (SCAPE: torchrun "
                       "on every node, world_size workers on each); one-node runs (RGC) use 1")
    gpus_per_node: int = Field(default=0, ge=0, description="GPUs per node (sbatch --gpus-per-"
                               "node); 0: none asked for")
    cpus_per_node: int | None = Field(default=None, ge=1, description="CPU cores per node "
                                      "(sbatch --cpus-per-task, one task per node); null: what "
                                      "the run uses (its workers' threads)")
    mem_gb: int | None = Field(default=None, ge=1, description="memory per node in GB (sbatch "
                               "--mem); null: the partition's default")
    time_min: int = Field(default=60, ge=1, description="time limit of a job in minutes "
                          "(sbatch --time); a job stopped at it is requeued and resumes from "
                          "its last checkpoint")
    account: str | None = Field(default=None, description="sbatch --account; null: your default")
    qos: str | None = Field(default=None, description="sbatch --qos; null: the partition's")
    sbatch: dict[str, str | int] = Field(default_factory=dict, description="further sbatch "
                                         "options, name: value without the dashes (e.g. "
                                         "constraint: h100)")
    max_running: int = Field(default=0, ge=0, description="how many jobs of one job array "
                             "run at once (its %N limit; one array per shape of job); 0: as "
                             "many as SLURM allows")
    poll_s: float = Field(default=10.0, gt=0.0, description="seconds between looks at the "
                          "queue while the stage waits for its jobs")

    @model_validator(mode="after")
    def _own_options_apart(self) -> SlurmConfig:
        # an option with a key of its own stays in one place (one declaration per setting)
        own = {"partition", "nodes", "gpus-per-node", "gpus_per_node", "cpus-per-task",
               "cpus_per_task", "mem", "time", "account", "qos", "array"}
        for name in self.sbatch:
            if name in own or name.lstrip("-") != name:
                raise field_error(f"sbatch.{name}", self.sbatch[name], "must be an option "
                                  "without its dashes and without a key of its own here "
                                  "(partition, nodes, gpus_per_node, cpus_per_node, mem_gb, "
                                  "time_min, account, qos, max_running)")
        return self


class LauncherConfig(Section):
    """``launcher:``: ``local`` (this machine) or ``slurm`` (jobs, with ``slurm:``'s options)."""

    key: ClassVar[str] = "launcher"

    kind: Literal["local", "slurm"] = Field(default="local", description="local: every run on "
                                            "this machine, one after another; slurm: every "
                                            "independent run one SLURM job")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="the jobs' options "
                               "(read with kind: slurm)")

    @model_validator(mode="after")
    def _slurm_complete(self) -> LauncherConfig:
        if self.kind == "slurm" and self.slurm.partition is None:
            raise field_error("slurm.partition", None, "is required with launcher.kind = "
                              "'slurm' (the partition to submit to; `sinfo` lists them)")
        return self
