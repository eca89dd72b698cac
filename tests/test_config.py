"""params.yaml: every profile validates; bad files stop with key path, value and rule."""

from pathlib import Path

import pytest
import yaml

from lmrepro.errors import ConfigError, ParameterError
from lmrepro.paramfile import deep_merge
from lmrepro.pipeline.params import load_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("profile", ["default", "smoke", "paper"])
def test_every_profile_of_the_real_params_file_validates(profile):
    params = load_params(ROOT / "params.yaml", profile)
    assert params.profile == profile
    assert set(params.train.corpora) <= set(params.data.use)


def test_paper_profile_is_paper_scale():
    params = load_params(ROOT / "params.yaml", "paper")
    assert params.model.n_layers == 24
    assert {"enwik8", "tinystories"} <= set(params.data.use)


def test_deep_merge_keeps_unset_keys():
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 5}}) == \
        {"a": {"b": 5, "c": 2}, "d": 3}


def write_variant(tmp_path, mutate) -> Path:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    mutate(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


BAD = [
    ("train.steps", -3, lambda r: r["train"].__setitem__("steps", -3),
     "greater than or equal to 1"),
    ("train.lr", "fast", lambda r: r["train"].__setitem__("lr", "fast"), "valid number"),
    ("train.stepz", 5, lambda r: r["train"].__setitem__("stepz", 5),
     "unknown key; did you mean steps?"),
    ("model.n_heads", 3, lambda r: r["model"].__setitem__("n_heads", 3), "must divide d_model"),
    ("data.use", "nope", lambda r: r["data"].__setitem__("use", ["nope"]), "not a corpus"),
    ("profile", "huge", lambda r: r.__setitem__("profile", "huge"), "one of"),
]


@pytest.mark.parametrize("key,value,mutate,rule", BAD, ids=[b[0] for b in BAD])
def test_bad_parameter_message_names_key_value_and_rule(tmp_path, key, value, mutate, rule):
    path = write_variant(tmp_path, mutate)
    with pytest.raises(ParameterError) as info:
        load_params(path)
    message = str(info.value)
    assert key.split(".")[-1] in message and repr(value).strip("[]'") in message
    assert rule in message


def test_config_error_lists_every_problem(tmp_path):
    def two_bad(r):
        r["train"]["steps"] = 0
        r["model"]["d_model"] = 1
    with pytest.raises(ConfigError) as info:
        load_params(write_variant(tmp_path, two_bad))
    assert "train.steps = 0" in str(info.value) and "model.d_model = 1" in str(info.value)


def test_missing_params_file(tmp_path):
    with pytest.raises(ParameterError, match="params_file"):
        load_params(tmp_path / "absent.yaml")


def _sections_with_renames() -> list[type]:
    from lmrepro.config import Section
    from lmrepro.pipeline.params import params_model

    # the schema imports every wing's sections (importing lmrepro.wings alone does not: run
    # first, as with -k, this test found none)
    params_model()

    out, todo = [], list(Section.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__dict__.get("renamed"):
            out.append(cls)
    return out


def test_every_renamed_key_is_refused_with_its_new_name():
    """A key a section renamed is never ignored nor silently mapped: building the section with
    it gives a one-line error naming the old key, its value and the new key (a field of the
    section, or a key of a nested one: ``model.n_layers``)."""
    sections = _sections_with_renames()
    names = {c.__name__ for c in sections}
    assert {"ScapeConfig", "RGCConfig", "RGCScaling", "ScalingStudy"} <= names
    for cls in sections:
        for old, hint in cls.renamed.items():
            assert old not in cls.model_fields, (cls.__name__, old)
            new = hint.split()[1]
            assert new.split(".")[0] in cls.model_fields, (cls.__name__, hint)
            with pytest.raises(ConfigError) as err:
                cls(**{old: 7})
            message = str(err.value)
            assert f"{old} = 7: this key was renamed: use {new}" in message
            assert len(message.splitlines()) == 1


@pytest.mark.parametrize("section,old,new", [
    ("scape", "density_warmup_steps", "sparsity_warmup_steps"),
    ("scape", "density_start", "sparsity_start"),
    ("rgc", "worker_timeout_s", "timeout_s"),
    ("rgc", "threads_per_worker", "threads"),
    ("rgc", "n_layers", "model.n_layers"),
    ("rgc", "context", "model.context"),
])
def test_an_old_key_in_the_params_file_names_the_new_one(tmp_path, section, old, new):
    def mutate(raw):
        value = raw[section].pop(new, 1)
        raw[section][old] = value
    with pytest.raises(ConfigError, match=rf"{section}\.{old} = .*renamed: use {new}"):
        load_params(write_variant(tmp_path, mutate))


def test_an_unknown_key_names_the_closest_valid_one(tmp_path):
    """A mistyped key is refused naming the key it was likely meant to be (not pydantic's bare
    "Extra inputs are not permitted"), in params.yaml and in a call alike; with none close, the
    message lists the section's keys. Every other problem is still reported beside it."""
    from lmrepro.model import ModelConfig
    from lmrepro.scape.config import ScapeConfig

    def mutate(raw):
        raw["scape"]["sparsty_start"] = 0.5
        raw["scap"] = {}
        raw["train"]["steps"] = -3
    with pytest.raises(ConfigError) as info:
        load_params(write_variant(tmp_path, mutate))
    lines = [line.split("): ", 1)[1] for line in str(info.value).splitlines()]
    assert sorted(lines) == ["scap = {...}: unknown key; did you mean scape?",
                             "scape.sparsty_start = 0.5: unknown key; did you mean "
                             "sparsity_start?",
                             "train.steps = -3: must be greater than or equal to 1"]
    with pytest.raises(ConfigError) as info:
        ScapeConfig(sparsty_start=0.5)
    assert str(info.value) == "scape.sparsty_start = 0.5: unknown key; did you mean " \
        "sparsity_start?"
    assert info.value.name == "scape.sparsty_start" and info.value.value == 0.5
    with pytest.raises(ConfigError) as info:
        ModelConfig(zzz=1)
    assert str(info.value) == (f"model.zzz = 1: unknown key (allowed: "
                               f"{', '.join(ModelConfig.model_fields)})")
