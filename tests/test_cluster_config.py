"""The ``launcher:`` section: local by default, slurm with its options; every mistake one line
naming the key, the value and what is allowed."""

from __future__ import annotations

import pytest
import yaml

from lmrepro.cluster.config import LauncherConfig
from lmrepro.errors import ParameterError


def test_default_is_local_and_params_yaml_says_so():
    from lmrepro.pipeline.params import load_params

    assert LauncherConfig().kind == "local"
    params = load_params("params.yaml")
    assert params.launcher == LauncherConfig()


def test_slurm_with_its_options():
    cfg = LauncherConfig(kind="slurm", slurm={
        "partition": "gpu", "nodes": 4, "gpus_per_node": 4, "cpus_per_node": 72,
        "time_min": 240, "account": "proj", "qos": "high", "sbatch": {"constraint": "h100"},
        "max_running": 8})
    assert cfg.slurm.nodes == 4 and cfg.slurm.sbatch == {"constraint": "h100"}


@pytest.mark.parametrize("raw,line", [
    ({"kind": "slurm"}, "launcher.slurm.partition = None: is required with launcher.kind = "
                        "'slurm'"),
    ({"kind": "slrum"}, "launcher.kind = 'slrum': must be 'local' or 'slurm'"),
    ({"kind": "slurm", "slurm": {"partition": "p", "nodez": 2}},
     "launcher.slurm.nodez = 2: unknown key; did you mean nodes?"),
    ({"kidn": "local"}, "launcher.kidn = 'local': unknown key; did you mean kind?"),
    ({"slurm": {"gpus_per_node": -1}}, "launcher.slurm.gpus_per_node = -1: must be greater "
                                       "than or equal to 0"),
    ({"slurm": {"time_min": "1:00:00"}}, "launcher.slurm.time_min = '1:00:00': must be a "
                                         "valid integer"),
    ({"slurm": {"sbatch": {"partition": "x"}}}, "launcher.slurm.sbatch.partition = 'x': must "
                                                 "be an option without its dashes and without "
                                                 "a key of its own here"),
    ({"slurm": {"sbatch": {"--exclusive": ""}}}, "launcher.slurm.sbatch.--exclusive = '': "
                                                  "must be an option without its dashes"),
])
def test_mistakes_are_one_line_naming_the_key(raw, line):
    with pytest.raises(ParameterError) as err:
        LauncherConfig(**raw)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_a_mistake_in_the_file_names_the_file_and_profile(tmp_path):
    from lmrepro.pipeline.params import load_params

    with open("params.yaml") as f:
        raw = yaml.safe_load(f)
    raw["profiles"]["smoke"]["launcher"] = {"kind": "slurm", "slurm": {"partitoin": "gpu"}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ParameterError, match=r"^.*params.yaml \(profile 'smoke'\): launcher\."
                       r"slurm\.partitoin = 'gpu': unknown key; did you mean partition\?$"):
        load_params(path)
