"""`dvc plots show` draws the training stages' data plots one line per run and seed, on a page
that needs no network (vega inlined by set-up from an installed package, no CDN)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from lmrepro.pipeline import dvcplots
from lmrepro.pipeline.stage_products import LOSS_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_the_page_inlines_vega_and_leaves_no_place_for_dvcs_cdn_scripts() -> None:
    page = dvcplots.page_html("window.vegaEmbed = function () {}; /* </script> */")
    assert "{plot_divs}" in page and "{scripts}" not in page
    assert "<\\/script>" in page and "http" not in page
    bundle = dvcplots.vega_bundle()      # from the installed package
    assert "window.vegaEmbed" in bundle and len(bundle) > 100_000


def test_the_projects_config_names_the_page_and_the_templates_draw_one_line_per_seed() -> None:
    config = (ROOT / ".dvc" / "config").read_text()
    assert re.search(r"\[plots\]\s+html_template = plots.html", config)
    assert "/plots.html" in (ROOT / ".dvc" / ".gitignore").read_text().split()
    assert "/dvc_plots/" in (ROOT / ".gitignore").read_text().split()
    for name in ("runs", "runs-log"):
        encoding = json.loads((ROOT / ".dvc" / "plots" / f"{name}.json").read_text())["encoding"]
        assert encoding["color"]["field"] == "run"
        assert [d["field"] for d in encoding["detail"]] == ["corpus", "seed"]
        assert encoding["strokeDash"]["field"] == "rev"
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    plotted = {next(iter(p)): next(iter(p.values())) for s in stages.values()
               for p in s.get("plots", []) if isinstance(p, dict)
               and next(iter(p)).endswith(".csv")}
    assert set(plotted) == {"results/baseline/loss_curve.csv", "results/scape/loss_curve.csv",
                            "results/rgc/loss_curve.csv", "results/scape/bytes_per_step.csv"}
    assert all(p["template"] in ("runs", "runs-log") and p["x"] == "step"
               for p in plotted.values())


def test_dvc_plots_show_writes_a_page_with_no_network_and_a_line_per_run_and_seed(
        tmp_path: Path) -> None:
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)
    shutil.copytree(ROOT / ".dvc" / "plots", tmp_path / ".dvc" / "plots")
    with open(tmp_path / ".dvc" / "config", "a") as f:
        f.write("[plots]\n    html_template = plots.html\n")
    dvcplots.write_page(tmp_path)
    rows = [",".join(LOSS_COLUMNS)] + [f"{run},tiny,{seed},{step},{3.0 - step / 10 + seed}"
                                       for run in ("adamw", "scape90") for seed in (0, 1)
                                       for step in range(4)]
    (tmp_path / "loss_curve.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "dvc.yaml").write_text(
        "plots:\n  - loss_curve.csv:\n      template: runs\n      x: step\n      y: loss\n")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(BIN / "dvc"), "plots", "show"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "dvc_plots" / "index.html").read_text()
    assert "cdn.jsdelivr" not in page and "<script src=" not in page
    assert page.index("window.vegaEmbed") < page.index("vegaEmbed('#")
    spec = json.loads(re.search(r"var spec = (\{.*?\});\s*vegaEmbed", page, re.S).group(1))
    values = spec["data"]["values"]
    assert {(v["run"], v["seed"]) for v in values} == {(r, s) for r in ("adamw", "scape90")
                                                       for s in ("0", "1")}
    assert spec["encoding"]["color"]["field"] == "run" and spec["encoding"]["x"]["field"] == "step"
