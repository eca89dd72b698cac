"""SCAPE's trainer in bf16 (autocast forward and backward, fp32 weights, optimizer state and
all-reduce) and with torch.compile, on CPU; fp32 stays the default and keeps its identity."""

from __future__ import annotations

import pytest
import torch

from _dist_helpers import write_tiny_corpus
from lmrepro.io import torch_load
from lmrepro.results import read_run

TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "context": 32}
COMMON = dict(steps=30, batch_size=8, lr=1e-2, warmup_steps=3, eval_batches=2, eval_batch_size=4,
              timeout_s=20, checkpoint_every=100)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _train(corpus, out, **kw):
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig, ScapeRun
    from lmrepro.scape.train.trainer import RunTarget, train

    train(ScapeConfig(**{**COMMON, **kw}), ScapeRun(optimizer="scape", sparsity=0.9),
          ModelConfig(**TINY), RunTarget(corpus_dir=str(corpus), out=str(out), seed=1))
    return read_run(out)


def _losses(run):
    return [r["loss"] for r in run["metrics"] if "loss" in r]


def test_bf16_trains_with_fp32_master_weights(corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    fp32 = _train(corpus, tmp_path / "fp32")
    bf16 = _train(corpus, tmp_path / "bf16", precision="bf16")
    lb, lf = _losses(bf16), _losses(fp32)
    assert len(lb) == 30
    # it learns: the last five steps' mean loss well below the first five's
    assert sum(lb[-5:]) / 5 < 0.8 * sum(lb[:5]) / 5
    # autocast really ran: the numbers differ from fp32's, though close at the start
    assert lb != lf and abs(lb[0] - lf[0]) < 0.05
    # master weights stay fp32; the final bits per byte within 5 % of fp32's
    weights = torch_load(tmp_path / "bf16" / "model_final.pt")["model"]
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert bf16["summary"]["final_bpb"] == pytest.approx(fp32["summary"]["final_bpb"], rel=0.05)
    assert bf16["summary"]["config"]["settings"]["precision"] == "bf16"


def test_fp32_default_keeps_identity_and_records():
    """precision and compile at their defaults are left out of records and identities, so the
    runs trained before they existed keep theirs; any other value is recorded."""
    from lmrepro.scape.config import ScapeConfig, ScapeSuite

    assert "precision" not in ScapeConfig().to_dict() and "compile" not in ScapeConfig().to_dict()
    assert ScapeConfig(compile=True).to_dict()["compile"] is True
    suite = ScapeSuite(corpus="c", runs=[{"optimizer": "adamw"}], precision="bf16")
    assert suite.to_dict()["precision"] == "bf16" and suite.settings.precision == "bf16"
    with pytest.raises(Exception, match=r"scape.precision = 'fp16': must be 'fp32' or 'bf16'"):
        ScapeConfig(precision="fp16")


@pytest.mark.slow
def test_compile_gives_a_run_close_to_eager(corpus, tmp_path, monkeypatch):
    """torch.compile of the training forward: the run trains to the eager run's result (the
    compiled kernels may round differently, so close, not equal)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    eager = _losses(_train(corpus, tmp_path / "eager", steps=10))
    compiled = _losses(_train(corpus, tmp_path / "compiled", steps=10, compile=True))
    assert compiled == pytest.approx(eager, rel=1e-3)
