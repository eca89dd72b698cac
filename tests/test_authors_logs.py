"""The extractor of Megatron-LM logs (lmrepro.scape.authors.logs) on verbatim excerpts of the
SCAPE authors' logs (tests/fixtures/authors_logs), and the committed table of their Vista runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lmrepro.errors import ParameterError
from lmrepro.scape.authors import logs as A

FIX = Path(__file__).resolve().parent / "fixtures" / "authors_logs"
DENSE32 = FIX / "baseline/AdamS/llama2-H2O-500M/llama2_500M_AdamS_1774499263.out"
DENSE4 = FIX / "baseline/AdamS/llama2-H2O-500M/llama2_500M_AdamS.out"
SCAPE = next((FIX / "reducers/d_0.1").glob("*.out"))
SRC = A.LogSource("mz687/SCAPE_SC26", "1a39ade93d993ddaee864ce25da39db3f4c75d7d",
                  "slurm_scripts/vista/" + str(DENSE32.relative_to(FIX)))


def test_iteration_lines_give_time_loss_and_grad_norm_with_glued_text_ignored() -> None:
    df = A.extract_file(DENSE32, SRC).set_index("iteration")
    assert list(df.index) == [54001, 54003, 54004]
    assert df.loc[54001, ["elapsed_ms", "lm_loss", "grad_norm"]].tolist() == [4442.1, 2.188036,
                                                                               0.123]
    assert df.loc[54004, "elapsed_ms"] == 2089.5 and df.loc[54003, "grad_norm"] == 0.074
    row = df.loc[54003]
    assert (row.world_size, row.method, row.model) == (32, "adams", "Llama-500M")
    # the microbatch line says 2, and 1024 / (16 x 32) agrees; the run resumed at 54000
    assert row.micro_batches == 2 and row.start_iteration == 54000
    assert row.density == 1.0 and math.isnan(row.val_loss)
    assert (row.repository, row.commit, row.path) == (SRC.repository, SRC.commit, SRC.path)


def test_the_reducer_density_applies_to_the_next_iteration_and_validation_attaches() -> None:
    df = A.extract_dir(FIX)
    s = df[df.path.str.startswith("reducers/")].set_index("iteration")
    # "step=K density=D" is printed during the step that logs iteration K + 1
    assert s.density.to_dict() == {4099: 0.763975, 4100: 0.763863, 4101: 0.76375}
    assert s.loc[4100, "val_loss"] == 2.529331 and s.val_loss.notna().sum() == 1
    assert s.loc[4100, "elapsed_ms"] == 2047.6      # the glued WARNING is not a field
    assert (s.method == "scape").all() and (s.target_density == 0.1).all()  # from the file name
    assert (df.repository == "local/logs").all() and set(df.method) == {"adams", "scape"}


def test_a_restart_opens_a_segment_whose_settings_carry_over() -> None:
    df = A.extract_file(DENSE4, A.LogSource("mz687/SCAPE_SC26", "",
                                                       "baseline/AdamS/llama2_500M_AdamS.out"))
    assert df.groupby("segment").iteration.apply(list).to_dict() == {0: [2, 29], 1: [4046]}
    assert (df.world_size == 4).all() and (df.clip_grad == 1.0).all()
    assert df.set_index("iteration").loc[2, "lm_loss"] == 10.70063
    assert df.start_iteration.iloc[0] == 0 and math.isnan(df.start_iteration.iloc[-1])
    # the layers were not read: the model comes from the file name's size
    assert (df.model == "Llama-500M").all() and (df.method == "adams").all()


def test_the_schedule_reproduces_the_densities_the_reducer_logged() -> None:
    s = {"topk_adams_density": 0.1, "topk_adams_start_iter": 2000,
         "topk_adams_density_warmup_steps": 8000}
    # logged in the authors' 32-rank run: step=4046 density=0.769825 (iteration 4047)
    assert A.scheduled_density(4047, s) == pytest.approx(0.769825, abs=1e-6)
    assert A.scheduled_density(2001, s) == 1.0 and A.scheduled_density(10001, s) == 0.1
    assert A.scheduled_density(2002, s) == pytest.approx(1 - 0.9 / 8000)
    assert math.isnan(A.scheduled_density(5, {}))


def test_settings_from_the_file_name_and_models_from_the_shape() -> None:
    name = ("reducers/TopK/llama2-500M/d_0.01/llama2_500M_AdamS_d_0.01_comp_start_step_0_"
            "d_warmup_steps_10000_lr_warmup_steps_2000_no_clip_grad_1774504257.out")
    assert A.settings_from_path(name) == {
        "topk_adams_density": 0.01, "topk_adams_start_iter": 0,
        "topk_adams_density_warmup_steps": 10000, "clip_grad": 0.0,
        "use_topk_adams_reducer": True}
    assert A.settings_from_path("baseline/AdamW/gpt-345M/x.out") == {"optimizer": "adamw"}
    assert A.model_name(24, 2560, "") == "Llama-1.8B"
    assert A.model_name(None, None, "gpt/d_0.1/GPT_345M_AdamS.out") == "GPT-345M"
    assert A.model_name(None, None, "runs/unknown.out") == ""


def test_an_excerpt_names_its_source_and_pages(tmp_path: Path) -> None:
    lines = DENSE32.read_text().splitlines()
    body = [f"# lmrepro-excerpt repository={SRC.repository} commit={SRC.commit} "
            f"path={SRC.path} total_chars=10697595", "# page offset=0", *lines[:12],
            "# page offset=56000", *lines[12:16], "# page offset=10684000", lines[16]]
    f = tmp_path / "x.out"
    f.write_text("\n".join(body) + "\n")
    df = A.extract_file(f)
    assert df.set_index("iteration").page_offset.to_dict() == {54001: 56000, 54003: 56000,
                                                                54004: 10684000}
    pages = A.excerpt_pages(f)
    assert pages["total_chars"] == "10697595" and pages["path"] == SRC.path
    assert [(p["offset"], p["first_iteration"], p["last_iteration"]) for p in pages["pages"]] \
        == [(0, None, None), (56000, 54001, 54003), (10684000, 54004, 54004)]


@pytest.mark.parametrize("call,name", [
    (lambda d: A.extract_file(d / "missing.out"), "log"),
    (lambda d: A.extract_file(_write(d, "empty.out", "no iteration here\n"), SRC), "log"),
    (lambda d: A.extract_file(_write(d, "x.out", DENSE32.read_text())), "source"),
    (lambda d: A.LogSource("mz687/SCAPE_SC26", "abc", "x.out"), "commit"),
    (lambda d: A.extract_dir(d / "nowhere"), "logs"),
])
def test_bad_input_is_one_line_naming_the_parameter(tmp_path: Path, call, name: str) -> None:
    with pytest.raises(ParameterError) as err:
        call(tmp_path)
    msg = str(err.value)
    assert msg.startswith(name) and "\n" not in msg and "must" in msg


def _write(d: Path, name: str, text: str) -> Path:
    (d / name).write_text(text)
    return d / name


def test_the_committed_table_is_found_through_the_package_and_matches_its_provenance() -> None:
    df = A.load_vista_table()
    prov = A.vista_provenance()
    assert list(df.columns) == A.COLUMNS and len(df) == prov["rows"]
    pages = {(f["path"], p["offset"]): p for f in prov["files"] for p in f["pages"]}
    for (path, off), rows in df.groupby(["path", "page_offset"]):
        p = pages[(path, int(off))]
        assert (rows.iteration.min(), rows.iteration.max()) == (p["first_iteration"],
                                                                p["last_iteration"])
    assert set(df.commit.str.len()) == {40} and (df.repository == "mz687/SCAPE_SC26").all()
    # the runs the claims rest on are there: dense AdamS on 4 and 32 ranks, SCAPE at 10 % sent
    has = df.groupby(["method", "world_size"]).size()
    assert has[("adams", 4)] > 50 and has[("adams", 32)] > 50 and has[("scape", 32)] > 200
    assert ((df.method == "scape") & (df.density.round(3) == 0.1)).sum() > 50


def test_the_command_writes_the_table(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    proc = subprocess.run([sys.executable, "-m", "lmrepro", "authors-logs", str(FIX), "--out",
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert pd.read_csv(out).iteration.tolist() == [2, 29, 4046, 54001, 54003, 54004, 4099, 4100,
                                                   4101]


def _excerpt(d: Path, name: str, path: str, lines: list[str]) -> None:
    (d / name).write_text(f"# lmrepro-excerpt repository=mz687/SCAPE_SC26 commit={'a' * 40} "
                          f"path={path} total_chars=5000\n" + "\n".join(lines) + "\n")


def test_merge_adds_logs_and_takes_a_jobs_settings_from_its_other_file(tmp_path: Path) -> None:
    """A job whose header went to another file: the page of that file is named as such, its
    settings apply, and the provenance names it; a log merged again replaces its rows, and a
    log now read leaves ``not_read``."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    it = " iteration {:>8}/  100000 | elapsed time per iteration (ms): {} | lm loss: 2.1 | "
    _excerpt(old, "a.out", "baseline/AdamS/x/a_1.out",
             ["# page offset=0", "using world size: 4", it.format(5, 100.0)])
    csv, prov = tmp_path / "t.csv", tmp_path / "t.json"
    A.write_table(old, csv, prov, notes={"not_read": [
        {"path": "baseline/AdamS/x/b_2.out", "why": "x"},
        {"path": "baseline/AdamS/x/h_2.out", "why": "x"}]})
    _excerpt(new, "b.out", "baseline/AdamS/x/b_2.out",
             ["# page offset=10 path=baseline/AdamS/x/h_2.out commit=" + "b" * 40,
              "GPTDatasetConfig(data_parallel_size=32)",
              "Overwriting rerun_state_machine.current_iteration from -1 to 7...",
              "# page offset=0", it.format(8, 300.0), it.format(9, 200.0)])
    _excerpt(new, "a.out", "baseline/AdamS/x/a_1.out",
             ["# page offset=0", "using world size: 4", it.format(5, 150.0)])
    df = A.merge_table(new, csv, prov, [{"path": "gpt/c.out", "why": "not read"}])
    b = df[df.path.str.endswith("b_2.out")]
    assert list(b.world_size) == [32, 32] and list(b.start_iteration) == [7, 7]
    assert list(df[df.path.str.endswith("a_1.out")].elapsed_ms) == [150.0]   # replaced
    p = json.loads(prov.read_text())
    assert p["rows"] == len(df) == 3
    assert [e["path"] for e in p["not_read"]] == ["gpt/c.out"]
    pages = {f["path"]: f["pages"] for f in p["files"]}
    assert pages["baseline/AdamS/x/b_2.out"][0]["path"] == "baseline/AdamS/x/h_2.out"
    with pytest.raises(ParameterError, match="^table"):
        A.merge_table(new, tmp_path / "none.csv", prov)
