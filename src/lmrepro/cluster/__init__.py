"""Where a stage's runs execute: on this machine (``launcher: kind: local``) or as SLURM jobs
submitted through submitit (``kind: slurm``). Shared by the wings; names no method of either
paper. :mod:`~lmrepro.cluster.config` is the ``launcher:`` section, :mod:`~lmrepro.cluster.jobs`
the submission, the job records in each run directory, reattachment and progress, and
:mod:`~lmrepro.cluster.nodes` the rendezvous a multi-node job takes from SLURM's environment."""
