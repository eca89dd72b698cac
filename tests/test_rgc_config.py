"""The rgc: section of params.yaml: placement and thread budgets checked at `lmrepro validate`,
every profile valid, the default profile fitting this 2-core budget, the paper's allocation."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from lmrepro.errors import ParameterError
from lmrepro.pipeline.params import load_params
from lmrepro.rgc import ThreadOversubscriptionWarning
from lmrepro.rgc.config import check_threads

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "params.yaml"


def with_rgc(tmp_path: Path, **rgc: object) -> Path:
    raw = yaml.safe_load(PARAMS.read_text())
    raw["rgc"].update(rgc)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("rgc, key, needle", [
    ({"stages_per_worker": [2, 1]}, "rgc.stages_per_worker",
     "must be integers >= 1 summing to n_stages = 4"),
    ({"stages_per_worker": [3, 2]}, "rgc.stages_per_worker", "summing to n_stages = 4"),
    ({"threads": [1, 1, 1]}, "rgc.threads",
     "must be 2 integers >= 1 (one per worker"),
    ({"threads": [2, 1]}, "rgc.threads",
     "must fit cores = 2: 3 threads in total"),
    ({"backprop_threads": 4}, "rgc.backprop_threads", "must fit cores = 2"),
    ({"horizon": 5}, "rgc.horizon", "must be an integer in [1, n_stages = 4]"),
    ({"horizon": 0}, "rgc.horizon", "greater than or equal to 1"),
    ({"local_loss_weight": -0.5}, "rgc.local_loss_weight", "greater than or equal to 0"),
    ({"local_loss_weight": 0.0}, "rgc.local_loss_weight",
     "must be > 0 at horizon 1 < n_stages = 4"),
])
def test_validate_refuses_bad_placements_with_key_path_value_and_rule(
        tmp_path: Path, rgc: dict, key: str, needle: str) -> None:
    path = with_rgc(tmp_path, **rgc)
    with pytest.raises(ParameterError) as ei:
        load_params(path)
    assert ei.value.name == key and needle in str(ei.value)
    assert f"{key} = {next(iter(rgc.values()))!r}" in str(ei.value)


def test_validate_command_refuses_a_placement_before_writing(tmp_path: Path) -> None:
    path = with_rgc(tmp_path, stages_per_worker=[2, 1])
    out = tmp_path / "resolved.json"
    proc = subprocess.run([sys.executable, "-m", "lmrepro", "validate", "--params", str(path),
                           "--write", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and not out.exists()
    assert "rgc.stages_per_worker = [2, 1]: must be integers >= 1 summing to n_stages = 4" in \
        proc.stderr


def test_every_profile_is_valid_and_validate_is_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # no oversubscription warning at validation
        default = load_params(PARAMS)
    proc = subprocess.run([sys.executable, "-W", "error", "-m", "lmrepro", "validate",
                           "--params", str(PARAMS)], capture_output=True, text=True)
    assert proc.returncode == 0 and "Warning" not in proc.stderr
    rgc = default.rgc
    # the default profile: 4 stages on 2 workers x 1 thread; backprop at the same 2 threads
    assert rgc.placement == [[0, 1], [2, 3]] and rgc.async_threads == rgc.cores == 2
    assert rgc.single_process_threads == rgc.async_threads


def test_paper_profile_encodes_the_papers_allocation_and_warns_when_run_here() -> None:
    paper = load_params(PARAMS, "paper").rgc
    assert (paper.async_threads, paper.single_process_threads, paper.cores) == (29, 24, 31)
    assert paper.n_workers == paper.n_stages == 4
    with pytest.warns(ThreadOversubscriptionWarning,
                      match=r"29 threads .* this machine has 2 cores \(rgc.cores = 31"):
        check_threads(paper.config, "async", cores=2)
    with pytest.warns(ThreadOversubscriptionWarning, match=r"rgc.backprop_threads = 24"):
        check_threads(paper.config, "backprop", cores=2)


def with_rgc_model(tmp_path: Path, **model: object) -> Path:
    raw = yaml.safe_load(PARAMS.read_text())
    raw["rgc"]["model"].update(model)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("model, line", [
    # ModelConfig's own rule, worded with the rgc.model key path
    ({"n_heads": 3}, "rgc.model.n_heads = 3: must divide d_model = 128"),
    # RGC's: a separate decoder replica and deterministic runs (refused, never overridden)
    ({"tie_embeddings": True}, "rgc.model.tie_embeddings = True: must be false: RGC's decoder "
     "is a separate replica every stage reads out through"),
    ({"dropout": 0.1}, "rgc.model.dropout = 0.1: must be 0.0: RGC runs are deterministic"),
    ({"n_layers": 6}, "rgc.n_stages = 4: must divide model.n_layers = 6"),
])
def test_the_model_is_a_model_config_whose_rules_name_the_rgc_model_key(
        tmp_path: Path, model: dict, line: str) -> None:
    with pytest.raises(ParameterError) as ei:
        load_params(with_rgc_model(tmp_path, **model))
    message = str(ei.value)
    assert line in message and len(message.splitlines()) == 1, message


@pytest.mark.parametrize("old", ["n_layers", "d_model", "n_heads", "context", "mlp_ratio"])
def test_a_flat_model_key_is_refused_naming_its_place_in_model(tmp_path: Path, old: str
                                                               ) -> None:
    raw = yaml.safe_load(PARAMS.read_text())
    raw["rgc"][old] = raw["rgc"]["model"][old]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ParameterError) as ei:
        load_params(path)
    assert ei.value.name == f"rgc.{old}"
    assert f"this key was renamed: use model.{old} (the model is a ModelConfig" in str(ei.value)
