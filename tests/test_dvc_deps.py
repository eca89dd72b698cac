"""dvc.yaml's dependencies match what each stage imports, by construction.

For every stage, the package modules its notebook (or command) imports are followed through
every ``import`` statement of the package, at any depth (function-level imports included), and
each module file reached must lie under one of the stage's ``deps``. Editing any of them then
re-runs the stage; a stage that imports a module its deps do not name fails here.

One module is covered differently: ``lmrepro.pipeline.params`` (the schema of the whole
parameter file, which imports every component's configuration class). The ``validate`` stage
depends on all of that and writes the validated, resolved parameters to ``results/params.json``;
a stage that depends on that file reads its configuration through it, so the traversal does not
follow ``params``' own imports for such a stage (modules the stage reaches otherwise still count).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]

#: the module that implements each stage command other than ``lmrepro notebook``
COMMAND_MODULES = {"validate": "lmrepro.pipeline.params", "report": "lmrepro.pipeline.report"}
#: the composition: every stage's program installs the wings (a notebook's first cell, the
#: ``lmrepro`` command)
WINGS = "lmrepro.wings"


def module_path(name: str) -> Path | None:
    base = SRC / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def lazy_exports(package: str) -> dict[str, str]:
    """``name -> submodule`` of a package whose ``__init__`` exports lazily (``_EXPORTS``)."""
    path = module_path(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_EXPORTS"
                                                for t in node.targets):
            return {k: f"{package}.{v}" for k, v in ast.literal_eval(node.value).items()}
    return {}


def imported_modules(tree: ast.AST, current: str, is_package: bool) -> set[str]:
    """Every ``lmrepro`` module named by an import in ``tree`` (absolute or relative), following
    the lazy exports of a package (``from lmrepro.optim import SCAPE`` reaches
    ``lmrepro.optim.scape``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "lmrepro"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = current if is_package else current.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            if base.split(".")[0] != "lmrepro":
                continue
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if module_path(f"{base}.{a.name}")}
            lazy = lazy_exports(base)
            found |= {lazy[a.name] for a in node.names if a.name in lazy}
    return {m for m in found if module_path(m)}


def registered(field: str) -> set[str]:
    """The modules the wings name in a field of their :class:`~lmrepro.pipeline.registry.Wing`
    (``claims="module"``, ``section=Section(key, "module:Class", ...)`` in each wing's
    ``wing.py``)."""
    found = set()
    for path in SRC.glob("lmrepro/*/wing.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == field:
                found |= {a.value.partition(":")[0] for a in ast.walk(node.value)
                          if isinstance(a, ast.Constant) and str(a.value).startswith("lmrepro.")}
    return found


#: imports made by name (``importlib``) that the traversal follows too: the schema
#: (``lmrepro.pipeline.params``) imports the wings' configuration classes, the claims registry
#: (``lmrepro.pipeline.claims``) the modules the wings declare claims in, the tables their
#: columns from
DYNAMIC_IMPORTS = {"lmrepro.pipeline.params": registered("section"),
                   "lmrepro.pipeline.claims": registered("claims"),
                   "lmrepro.pipeline.tables": registered("tables")}

PARAMS = "lmrepro.pipeline.params"
RESOLVED = "results/params.json"


def closure(roots: set[str], leaves: frozenset[str] = frozenset()) -> set[Path]:
    """Module files reached from ``roots``, with the ``__init__`` of every enclosing package;
    the imports of ``leaves`` are not followed."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        if name in leaves:
            continue
        path = module_path(name)
        assert path is not None, name
        tree = ast.parse(path.read_text(), filename=str(path))
        todo += imported_modules(tree, name, path.name == "__init__.py")
        todo += DYNAMIC_IMPORTS.get(name, set())
    return {module_path(m) for m in seen}


def stage_roots(stage: dict) -> set[str]:
    cmd = stage["cmd"].split()
    if cmd[:2] == ["lmrepro", "notebook"]:
        nb = json.loads((ROOT / cmd[2]).read_text())
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        roots = imported_modules(ast.parse(code), "__notebook__", False)
        return roots | {"lmrepro.pipeline.notebook"}
    return {COMMAND_MODULES[cmd[1]], WINGS}    # the lmrepro command installs the wings


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_deps_cover_every_imported_module(name: str) -> None:
    stage = STAGES[name]
    deps = [ROOT / d for d in stage.get("deps", [])]
    for d in deps:
        assert d.exists() or not str(d).startswith(str(SRC)), f"{name}: dep {d} does not exist"
    leaves = frozenset({PARAMS}) if RESOLVED in stage.get("deps", []) else frozenset()
    missing = sorted(str(p.relative_to(ROOT)) for p in closure(stage_roots(stage), leaves)
                     if not any(p == d or d in p.parents for d in deps))
    assert not missing, f"stage {name} imports modules its dvc.yaml deps do not name: {missing}"


def test_validated_parameters_are_what_stages_read() -> None:
    # every stage but validate reads its configuration through results/params.json, and validate
    # writes it with the schema's whole closure in its deps
    assert all(RESOLVED in s["deps"] for n, s in STAGES.items() if n != "validate")
    outs = {next(iter(o)) if isinstance(o, dict) else o: o for o in STAGES["validate"]["outs"]}
    assert RESOLVED in outs
    # persisted: DVC must not delete it before validate runs (a bad parameter keeps it)
    assert outs[RESOLVED] == {RESOLVED: {"persist": True}}
    assert module_path(PARAMS) in closure({COMMAND_MODULES["validate"]})


def test_the_check_follows_function_level_and_relative_imports() -> None:
    # guard against a vacuous pass: the scape stage reaches the optimizers through a relative
    # import inside lmrepro.optim, and the trainer through a function-level import of the CLI
    reached = closure({"lmrepro.scape.stage"})
    assert SRC / "lmrepro" / "optim" / "adams.py" in reached
    assert SRC / "lmrepro" / "scape" / "trainer.py" in closure({"lmrepro.scape.worker"})
    # and the wings, which every stage's program installs
    assert SRC / "lmrepro" / "rgc" / "wing.py" in closure(stage_roots(STAGES["analysis_rgc"]))
    assert registered("claims") == {"lmrepro.scape.claims", "lmrepro.rgc.claims"}
    assert SRC / "lmrepro" / "rgc" / "claims.py" in closure({"lmrepro.pipeline.claims"})
    assert SRC / "lmrepro" / "scape" / "config.py" in closure({"lmrepro.pipeline.params"})
