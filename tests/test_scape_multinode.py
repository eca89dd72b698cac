"""Multi-node torchrun without a cluster: two torchrun agents on this machine (``--nnodes 2``,
node ranks 0 and 1, a c10d rendezvous on localhost, one worker each) train the SCAPE run that
the single-node 2-worker run trains, bit for bit."""

from __future__ import annotations

import threading

import pytest
import torch

from _dist_helpers import write_tiny_corpus
from lmrepro.io import torch_load
from lmrepro.results import read_run

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "context": 32}


@pytest.mark.slow
def test_two_agents_equal_one_node_with_two_workers(tmp_path):
    from lmrepro.distributed import free_port
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun
    from lmrepro.scape.train.launch import Nodes, launch_log, launch_train_scape

    corpus = write_tiny_corpus(tmp_path / "corpus")
    cfg = ScapeConfig(steps=10, batch_size=4, lr=3e-3, warmup_steps=2, eval_batches=2,
                      eval_batch_size=4, timeout_s=60, checkpoint_every=100,
                      sparsity_warmup_steps=3)
    args = (cfg, ScapeRun(optimizer="scape", sparsity=0.9), ModelConfig(**TINY))
    one = launch_train_scape(corpus, tmp_path / "one", 2, *args, seed=5, timeout_s=200)

    endpoint = f"localhost:{free_port()}"
    errors: list[BaseException] = []

    def agent(rank: int) -> None:
        try:
            launch_train_scape(corpus, tmp_path / "two", 1, *args, seed=5, timeout_s=200,
                               nodes=Nodes(count=2, rank=rank, endpoint=endpoint))
        except BaseException as exc:    # reported below, with the other agent's outcome
            errors.append(exc)

    agents = [threading.Thread(target=agent, args=(r,)) for r in (0, 1)]
    for t in agents:
        t.start()
    for t in agents:
        t.join()
    assert not errors, errors
    two = tmp_path / "two"
    for rank in (0, 1):          # each agent really was one node of two, with one worker
        log = launch_log(two, rank).read_text()
        assert f"--nnodes 2 --node-rank {rank} --rdzv-backend c10d" in log
        assert "--nproc-per-node 1" in log

    a, b = read_run(one), read_run(two)
    assert b["summary"]["processes"] == 2
    keys = ("step", "loss", "bytes_grad_values", "bytes_mask", "sparsity", "grad_norm")
    rows_a = [{k: r[k] for k in keys} for r in a["metrics"] if "loss" in r]
    rows_b = [{k: r[k] for k in keys} for r in b["metrics"] if "loss" in r]
    assert len(rows_a) == 10 and rows_a == rows_b
    assert a["eval_losses"] == b["eval_losses"]
    ma, mb = (torch_load(d / "model_final.pt")["model"] for d in (one, two))
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
