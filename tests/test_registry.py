"""The wings' vocabulary as the pipeline reads it (lmrepro.pipeline.registry): each wing's one
value (Wing), listed by lmrepro.wings and installed explicitly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lmrepro.errors import ParameterError
from lmrepro.pipeline import registry
from lmrepro.wings import WINGS, Method

SRC = Path(__file__).resolve().parents[1] / "src" / "lmrepro"
METHODS = ("backprop", "adamw", "adams", "scape", "scape_stale_m", "topk", "topk_adamw", "rgc")


def test_methods_roles_and_pairings() -> None:
    assert registry.methods() == METHODS
    assert tuple(m.value for m in Method) == METHODS
    assert registry.data_parallel_roles() == ("adamw", "adams", "scape", "scape_stale_m", "topk",
                                              "topk_adamw")
    # the facts the wings name: what splits a method's runs into roles, SCAPE's setting, and
    # the byte kinds of SCAPE's collectives
    assert registry.setting("scape") == registry.setting("adamw") == "sparsity"
    assert registry.setting("rgc_async") is registry.setting("backprop") is None
    assert registry.settings() == ("sparsity",)
    assert registry.identity_facts() == ("executor", "sparsity")
    assert list(registry.byte_kinds()) == ["grad_values", "param_values", "mask"]
    assert registry.run_facts("topk") == ("mean_sparsity",) and registry.run_facts("rgc_sync") == ()
    assert registry.pairings() == (
        ("scape", "adamw"), ("scape", "adams"), ("scape_stale_m", "adamw"),
        ("scape_stale_m", "adams"), ("topk", "adamw"), ("topk", "adams"),
        ("topk_adamw", "adamw"), ("rgc_async", "backprop"), ("rgc_sync", "backprop"))
    assert registry.stages() == {"scape": ("adamw", "adams"), "rgc": ("backprop", None)}
    assert [s.key for s in registry.sections()] == ["train", "scape", "rgc"]
    assert registry.record_stages() == ("scape", "rgc", "scaling", "rgc_scaling")
    assert [c.id for c in registry.claims()][0].startswith("scape-")
    assert not registry.is_role("sgd")


def test_the_timed_pairings_are_pairings_of_their_wing() -> None:
    """The pairings whose throughput the timing history pools: async RGC against backprop."""
    assert registry.timed_pairings() == (("rgc_async", "backprop"),)
    stray = registry.Wing("test", timed=(("rgc_sync", "backprop"),))
    with pytest.raises(ParameterError, match="must be one of its pairings"):
        registry.install((*WINGS, stray))
    assert registry.timed_pairings() == (("rgc_async", "backprop"),)


def test_a_role_is_registered_once() -> None:
    twice = registry.Wing("test", roles=(registry.Role("scape", "scape"),))
    with pytest.raises(ParameterError, match="registered once"):
        registry.install((*WINGS, twice))
    # refused as a whole: the wings installed before stay
    assert registry.wings() == WINGS and registry.role("scape").wing == "scape"


def test_the_wings_are_installed_explicitly_and_in_their_order() -> None:
    """Nothing registers when a module is imported: a wing is a value, listed by lmrepro.wings;
    installing a list makes it the vocabulary, in the list's order."""
    baseline, scape, rgc = WINGS
    assert [w.name for w in WINGS] == ["baseline", "scape", "rgc"]
    try:
        registry.install((baseline, rgc))
        assert registry.methods() == ("backprop", "rgc")
        assert [s.key for s in registry.sections()] == ["train", "rgc"]
        assert registry.record_stages() == ("rgc", "rgc_scaling")
    finally:
        registry.install(WINGS)
    assert registry.methods() == METHODS


def test_the_shared_parts_name_no_method() -> None:
    """No string constant of the pipeline or results.py is a method or role name, or a fact or
    byte kind a wing names (what splits its runs into roles, its labels, its setting, the facts
    its records keep)."""
    roles = registry.roles().values()
    facts = ({r.by for r in roles} | {f for r in roles for _, f in r.label_details}
             | set(registry.settings()) | set(registry.byte_kinds())
             | {f for w in registry.wings() for f in w.run_facts}) - {None}
    names = set(registry.methods()) | set(registry.roles()) | facts
    for path in [*sorted((SRC / "pipeline").glob("*.py")), SRC / "results.py"]:
        found = [n.value for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Constant) and n.value in names]
        assert not found, f"{path.name} names {found}"


def test_a_method_split_into_roles_is_split_by_one_fact_of_its_details() -> None:
    from lmrepro.results import RunDetails

    assert registry.role_of("rgc", RunDetails(executor="sync")) == "rgc_sync"
    assert registry.role_of("backprop", RunDetails(executor="backprop")) == "backprop"
    assert registry.role_of("backprop") == "backprop"             # the fact not recorded
    assert registry.role_of("scape", RunDetails(executor="async")) == "scape"   # not SCAPE's
    with pytest.raises(ParameterError, match=r"details.executor = None.*'async', 'sync'"):
        registry.role_of("rgc", RunDetails())
    other_fact = registry.Wing("test", roles=(registry.Role("rgc_h2", "rgc", by="horizon",
                                                            values=(2,)),))
    with pytest.raises(ParameterError, match="other roles of method 'rgc'"):
        registry.install((*WINGS, other_fact))
    same_runs = registry.Wing("test", roles=(registry.Role("rgc_again", "rgc", by="executor",
                                                           values=("sync",)),))
    with pytest.raises(ParameterError, match="no other role.*rgc_sync"):
        registry.install((*WINGS, same_runs))
    assert registry.wings() == WINGS


def _summary(method: str, details: dict) -> dict:
    return {"name": "r", "method": method, "corpus": "c", "seed": 0, "steps": 1, "tokens": 1,
            "final_bpb": 3.0, "tokens_per_s": 1.0, "mean_step_time_s": 1.0, "train_time_s": 1.0,
            "peak_rss_bytes": 1, "n_params": 1, "processes": 1, "threads": 1,
            "details": details}


def test_a_summary_reads_its_details_as_its_wing_declares_them() -> None:
    from pydantic import ValidationError

    from lmrepro.baseline.details import BackpropDetails
    from lmrepro.results import RunSummary
    from lmrepro.rgc.details import RGCDetails
    from lmrepro.scape.details import ScapeDetails
    s = RunSummary.model_validate(_summary("scape", {"lr": 0.002, "final_coverage": 0.5,
                                                     "written_by_an_older_version": 1}))
    assert isinstance(s.details, ScapeDetails) and s.details.lr == 0.002
    assert s.details.final_test_bpb is None                  # declared, not set
    # written back: exactly the facts the trainer set, older keys kept
    assert s.to_json()["details"] == {"lr": 0.002, "final_coverage": 0.5,
                                      "written_by_an_older_version": 1}
    r = RunSummary.model_validate(_summary("rgc", {"horizon": 2, "placement": [[0, 1], [2, 3]]}))
    assert isinstance(r.details, RGCDetails) and r.details.horizon == 2
    b = RunSummary.model_validate(_summary("backprop", {"final_test_bpb": 2.5}))
    assert type(b.details) is BackpropDetails and b.details.final_test_bpb == 2.5
    assert RGCDetails.of(b).horizon is None                  # read as another wing's class
    # a summary read as JSON (the reports' runs): the same reading
    assert RGCDetails.of(r.to_json()).placement == [[0, 1], [2, 3]]
    assert ScapeDetails.of(_summary("scape", {"lr": 0.004})).lr == 0.004
    assert RGCDetails.of({"name": "no details"}).horizon is None
    with pytest.raises(ValidationError, match="horizon"):
        RunSummary.model_validate(_summary("rgc", {"horizon": "two"}))


def test_a_summary_written_with_its_wings_facts_beside_the_common_ones_reads_the_same() -> None:
    """Published summaries kept the executor and the sparsity beside the common fields: read,
    they are in the details (None: not recorded), and written back only there."""
    from lmrepro.results import RunSummary
    from lmrepro.rgc.details import RGCDetails
    from lmrepro.scape.details import ScapeDetails

    old = {**_summary("rgc", {"horizon": 2}), "executor": "async", "sparsity": None}
    s = RunSummary.model_validate(old)
    assert s.details.fact("executor") == "async" and "sparsity" not in s.to_json()["details"]
    assert "executor" not in s.to_json() and RunSummary.model_validate(s.to_json()) == s
    assert RGCDetails.of(old).executor == "async"           # read as JSON: the same
    dense = RunSummary.model_validate({**_summary("adamw", {}), "executor": None,
                                       "sparsity": 0.0})
    assert ScapeDetails.of(dense).sparsity == 0.0 and dense.details.fact("executor") is None
    both = {**_summary("backprop", {"executor": "backprop"}), "executor": "pipelined_backprop"}
    assert RunSummary.model_validate(both).details.fact("executor") == "backprop"  # details win
    with pytest.raises(ValueError, match="no_such_field"):
        RunSummary.model_validate({**_summary("rgc", {}), "no_such_field": 1})
