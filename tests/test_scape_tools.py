"""The SCAPE wing's tools: the learning-rate sweep (selection, table, a real run through the
stage), the SCAPE report (ablation table, curves, sweep grid, the generated docs section), and
the GPU check (its no-CUDA exit and a CPU dry run of its checks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _dist_helpers import write_tiny_corpus
from lmrepro.errors import ParameterError
from lmrepro.io import read_json

ROOT = Path(__file__).resolve().parents[1]
TINY = {"n_layers": 1, "d_model": 16, "n_heads": 2, "context": 16}


def test_sweep_grid_must_be_log_spaced_and_long_enough():
    from lmrepro.scape.config import ScapeSweep

    ok = ScapeSweep(lrs=[1e-3, 2e-3, 4e-3, 8e-3], steps=10)
    assert ok.ratio == pytest.approx(2.0) and ok.on_edge(8e-3) and not ok.on_edge(2e-3)
    with pytest.raises(ParameterError, match=r"scape\.sweep\.lrs.*at least 4"):
        ScapeSweep(lrs=[1e-3, 2e-3, 4e-3], steps=10)
    with pytest.raises(ParameterError, match="log-spaced"):
        ScapeSweep(lrs=[1e-3, 2e-3, 3e-3, 4e-3], steps=10)
    with pytest.raises(ParameterError, match="increasing"):
        ScapeSweep(lrs=[4e-3, 2e-3, 1e-3, 5e-4], steps=10)


def test_select_best_ignores_diverged_and_prefers_lower_bpb():
    from lmrepro.scape.train.sweep import apply_best, sweep_table
    from lmrepro.scape.config import ScapeRun, ScapeSweep
    from lmrepro.sweep import select_best

    rows = [{"run": "a", "lr": 1e-3, "final_bpb": 3.0, "diverged_at_step": None},
            {"run": "a", "lr": 2e-3, "final_bpb": 2.9, "diverged_at_step": None},
            {"run": "a", "lr": 4e-3, "final_bpb": None, "diverged_at_step": 7},
            {"run": "b", "lr": 1e-3, "final_bpb": None, "diverged_at_step": 3},
            {"run": "c", "lr": 1e-3, "final_bpb": 3.1, "diverged_at_step": None},
            {"run": "c", "lr": 8e-3, "final_bpb": 3.1, "diverged_at_step": None}]
    assert select_best(rows) == {"a": 2e-3, "c": 1e-3}            # tie: the smaller lr
    sweep = ScapeSweep(lrs=[1e-3, 2e-3, 4e-3, 8e-3], steps=5)
    table = sweep_table(rows, sweep)
    assert table["on_edge"] == ["c"] and table["all_diverged"] == ["b"]
    assert [r["best"] for r in table["rows"]] == [False, True, False, False, True, False]
    runs = [ScapeRun(name="a", optimizer="adams"), ScapeRun(name="b", optimizer="adamw", lr=0.5)]
    assert [r.lr for r in apply_best(runs, table["best"])] == [2e-3, 0.5]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"), n_words=8000)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stage_runs_the_sweep_then_the_suite_at_the_winners(corpus, tmp_path, monkeypatch):
    """A real sweep and suite through lmrepro.scape.stage (world 1, each run trained in this
    process instead of under torchrun), then the SCAPE report and the docs section from them."""
    from lmrepro.model import ModelConfig
    from lmrepro.scape.analysis import report
    from lmrepro.scape.train import launch
    from lmrepro.scape.config import ScapeRun, ScapeSuite, ScapeSweep
    from lmrepro.scape.stage import run_suite
    from lmrepro.scape.train.trainer import RunTarget, train

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)

    def in_process(corpus_dir, out, world, cfg, run, model, *, seed=0, corpus="", **_):
        return train(cfg, run, model, RunTarget(str(corpus_dir), str(out), seed, corpus))

    monkeypatch.setattr(launch, "launch_train_scape", in_process)
    prepared = Path(corpus).parent
    os.rename(corpus, prepared / "tiny")
    suite = ScapeSuite(
        corpus="tiny", world_size=1, steps=6, batch_size=2, lr=1e-3, warmup_steps=1,
        eval_batches=2, eval_batch_size=2, checkpoint_every=0, sparsity_warmup_steps=2,
        runs=[ScapeRun(name="adams", optimizer="adams"),
              ScapeRun(name="scape90", optimizer="scape", sparsity=0.9),
              ScapeRun(name="scape90_stale_m", optimizer="scape", sparsity=0.9,
                       mask_rule="stale_m")],
        sweep=ScapeSweep(lrs=[1e-3, 1e-2, 1e-1, 1.0], steps=4, seed=11))
    stage = tmp_path / "results" / "scape"
    out = run_suite(suite, ModelConfig(**TINY), [0], prepared, stage)
    table = read_json(stage / "sweep" / "sweep.json")
    assert len(table["rows"]) == 12 and set(table["best"]) <= {"adams", "scape90",
                                                                "scape90_stale_m"}
    assert (stage / "sweep" / "sweep.csv").read_text().startswith("run,method,sparsity,lr")
    for key, run_dir in out.items():
        s = read_json(run_dir / "summary.json")
        name = key.split("/")[-1]
        if name in table["best"]:
            assert s["details"]["lr"] == table["best"][name], name
    sweep_seeds = {read_json(d / "summary.json")["seed"]
                   for d in (stage / "sweep" / "runs" / "tiny").iterdir() if d.is_dir()}
    assert sweep_seeds == {11}

    rep = report.scape_report(tmp_path / "results", tmp_path / "analysis")
    ab = rep["tables"]["ablation"]
    assert list(ab["method"]) == ["adams", "scape", "scape_stale_m"]
    assert all(0 < float(c) <= 1 for c in ab["final coverage"][1:])
    for name in ("coverage", "coverage_at_target", "residual_norm", "sparsity", "sweep"):
        assert (tmp_path / "analysis" / f"scape_{name}.png").stat().st_size > 1000
    lrq = rep["tables"]["lr_findings"].set_index("run")
    assert sorted(lrq["rank at its best lr"]) == [1, 2, 3]
    for run, lr in table["best"].items():
        assert lrq.loc[run, "best lr"] == f"{lr:g}"
    grid = rep["tables"]["sweep"]
    assert list(grid["lr"]) == ["0.001", "0.01", "0.1", "1"] and grid.shape[1] == 4
    doc = tmp_path / "scape.md"
    doc.write_text(f"# x\n\n{report.BEGIN}\nold\n{report.END}\n\ntail\n")
    from lmrepro.pipeline.sections import write_marked

    write_marked(doc, report.BEGIN, report.END, report.doc_section(rep, "results"))
    text = doc.read_text()
    assert "old" not in text and text.endswith("tail\n") and "SCAPE-stale_m 90 %" in text
    assert "Learning-rate sweep" in text and "seeds [0]" in text


def test_gpu_check_script_without_cuda_says_so_and_exits_0():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the check")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")],
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout and "nothing to check" in proc.stdout


def test_gpu_check_script_reports_a_missing_interpreter():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")],
                          env=dict(os.environ, PYTHON="/nonexistent/python"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "not importable" in proc.stdout


@pytest.mark.timeout(120)
def test_gpu_check_dry_run_on_cpu(monkeypatch, capsys):
    """The GPU check's own checks, run on the CPU (gloo-less world of one): they pass, and
    they are real: a SCAPE that drifts from AdamS fails them."""
    from lmrepro.scape.train import gpu_check

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert gpu_check.main(["--device", "cpu", "--steps", "4", "--batch", "2", "--layers", "1",
                           "--d-model", "32"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "scape99" in out and "adamw" in out
    monkeypatch.setattr(gpu_check, "check_sparsity_zero", lambda *a: 1e-3)
    assert gpu_check.main(["--device", "cpu", "--steps", "3", "--batch", "2", "--layers", "1",
                           "--d-model", "32"]) == 1
    assert "differs from AdamS" in capsys.readouterr().out
