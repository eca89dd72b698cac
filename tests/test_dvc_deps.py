"""dvc.yaml's code dependencies are what each stage imports, at package granularity, by
construction.

For every stage, the package modules its notebook (or command) imports are followed through
every ``import`` statement of the package, at any depth (function-level imports included), and
each module file reached must lie under one of the stage's ``deps``, and so must the package data
a reached module reads through :mod:`importlib.resources` (``files("lmrepro.scape") / "data"``).
Editing any of them then re-runs the stage; a stage that imports a module its deps do not name
fails here.

The deps name what is reached at package granularity, no more (:func:`expected_deps`):

* the stage's own wing, a wing whose modules its notebook imports (the stage runs its code): the
  wing's folder (``src/lmrepro/scape``);
* a shared subpackage (``pipeline``, ``data``, ``optim``, ``bench``): its folder; a top-level
  module (``model.py``, ``wings.py``) or the package's ``__init__``: its file;
* another wing: only its files the stage reaches. The program installs every wing and the
  pipeline imports what a wing declares by name (its section's class, claims, columns), so that
  is its ``wing.py`` with what it imports and the modules it names there that the stage's code
  asks the pipeline for; never the wing's trainer, stage or reports;
* package data a reached module reads, where no folder above names it.

A dep that this rule does not give fails too (a whole other wing, a file where its folder is
the unit), so a change in one wing re-runs its own stages and, of the others, only those that
read the file changed.

One module is covered differently: ``lmrepro.pipeline.params`` (the schema of the whole
parameter file, which imports every component's configuration class). The ``validate`` stage
depends on all of that and writes the validated, resolved parameters to ``results/params.json``;
a stage that depends on that file reads its configuration through it, so the traversal does not
follow ``params``' own imports for such a stage (modules the stage reaches otherwise still count).
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "lmrepro"
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]

#: the module that implements each stage command other than ``lmrepro notebook``
COMMAND_MODULES = {"validate": "lmrepro.pipeline.params", "report": "lmrepro.pipeline.report"}
#: the composition: every stage's program installs the wings (a notebook's first cell, the
#: ``lmrepro`` command)
WINGS = "lmrepro.wings"
#: the wings' packages: those that declare a ``WING`` in a ``wing`` module
WING_PACKAGES = frozenset(p.parent.name for p in PACKAGE.glob("*/wing.py"))


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


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A module file's syntax tree (read once: the tests only read the files)."""
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def lazy_exports(package: str) -> dict[str, str]:
    """``name -> submodule`` of a package whose ``__init__`` exports lazily (``_EXPORTS``)."""
    path = module_path(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.walk(parsed(path)):
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
    if current == WINGS:            # the composition names each wing's module by string
        found |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                  and isinstance(n.value, str) and n.value.startswith("lmrepro.")}
    return {m for m in found if module_path(m)}


def package_data(tree: ast.AST) -> set[Path]:
    """The files and folders of the package that ``tree`` reads through
    :func:`importlib.resources.files`: ``files("lmrepro.scape") / "data" / NAME`` reads
    ``src/lmrepro/scape/data`` (the path up to its first part that is not a string constant)."""
    chains = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)]
    inner = {id(n.left) for n in chains}
    found = set()
    for node in (n for n in chains if id(n) not in inner):     # each whole ``a / b / c``
        parts: list[ast.expr] = []
        left: ast.expr = node
        while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Div):
            parts.insert(0, left.right)
            left = left.left
        call = left if isinstance(left, ast.Call) else None
        if (call is None or getattr(call.func, "attr", getattr(call.func, "id", None)) != "files"
                or not call.args or not isinstance(call.args[0], ast.Constant)
                or not str(call.args[0].value).startswith("lmrepro")):
            continue
        path = SRC / Path(*str(call.args[0].value).split("."))
        for part in parts:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            path /= part.value
        found.add(path)
    return found


def registered(field: str, wing: str | None = None) -> set[str]:
    """The modules the wings (or one wing) name in a field of their
    :class:`~lmrepro.pipeline.registry.Wing` (``claims="module"``,
    ``section=Section(key, "module:Class", ...)`` in each wing's ``wing.py``)."""
    found = set()
    for path in PACKAGE.glob(f"{wing or '*'}/wing.py"):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.keyword) and node.arg == field:
                found |= {a.value.partition(":")[0] for a in ast.walk(node.value)
                          if isinstance(a, ast.Constant) and str(a.value).startswith("lmrepro.")}
    return found


#: imports made by name (``importlib``) that the traversal follows too: the schema
#: (``lmrepro.pipeline.params``) imports the wings' configuration classes, the claims registry
#: (``lmrepro.pipeline.claims``) the modules the wings declare claims in, the tables their
#: columns from
DYNAMIC_FIELDS = {"lmrepro.pipeline.params": "section", "lmrepro.pipeline.claims": "claims",
                  "lmrepro.pipeline.tables": "tables"}
DYNAMIC_IMPORTS = {module: registered(field) for module, field in DYNAMIC_FIELDS.items()}

PARAMS = "lmrepro.pipeline.params"
RESOLVED = "results/params.json"


def closure_modules(roots: set[str], leaves: frozenset[str] = frozenset()) -> set[str]:
    """Modules reached from ``roots``, with every enclosing package; the imports of ``leaves``
    are not followed."""
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
        todo += imported_modules(parsed(path), name, path.name == "__init__.py")
        todo += DYNAMIC_IMPORTS.get(name, set())
    return seen


def closure(roots: set[str], leaves: frozenset[str] = frozenset()) -> set[Path]:
    """Module files reached from ``roots`` (:func:`closure_modules`)."""
    return {p for m in closure_modules(roots, leaves) if (p := module_path(m)) is not None}


def stage_roots(stage: dict) -> set[str]:
    cmd = stage["cmd"].split()
    if cmd[:2] == ["lmrepro", "notebook"]:
        return notebook_imports(stage) | {"lmrepro.pipeline.notebook"}
    return {COMMAND_MODULES[cmd[1]], WINGS}    # the lmrepro command installs the wings


def notebook_imports(stage: dict) -> set[str]:
    """The modules a notebook stage's code cells import (none for a command)."""
    cmd = stage["cmd"].split()
    if cmd[:2] != ["lmrepro", "notebook"]:
        return set()
    nb = json.loads((ROOT / cmd[2]).read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    return imported_modules(ast.parse(code), "__notebook__", False)


def with_data(files: set[Path]) -> set[Path]:
    """Module files and the package data they read (:func:`package_data`)."""
    return files | {d for f in files for d in package_data(parsed(f))}


def reached(stage: dict) -> set[Path]:
    """The module files a stage reaches and the package data they read."""
    leaves = frozenset({PARAMS}) if RESOLVED in stage.get("deps", []) else frozenset()
    return with_data(closure(stage_roots(stage), leaves))


def own_wings(stage: dict) -> set[str]:
    """The wings whose modules the stage's notebook imports: the stage runs their code."""
    return {m.split(".")[1] for m in notebook_imports(stage) if "." in m} & WING_PACKAGES


def unit_dep(path: Path, own: set[str]) -> Path:
    """The dep that covers ``path`` at package granularity for a stage of the wings ``own``."""
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1 or (parts[0] in WING_PACKAGES and parts[0] not in own):
        return path
    return PACKAGE / parts[0]


def expected_deps(stage: dict) -> set[str]:
    """The stage's code deps (paths under ``src/``) at package granularity (module docstring)."""
    own = own_wings(stage)
    deps = {unit_dep(p, own) for p in reached(stage)}
    return {str(d.relative_to(ROOT)) for d in deps if not any(o in d.parents for o in deps)}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_deps_cover_every_imported_module(name: str) -> None:
    stage = STAGES[name]
    deps = [ROOT / d for d in stage.get("deps", [])]
    for d in deps:
        assert d.exists() or not str(d).startswith(str(SRC)), f"{name}: dep {d} does not exist"
    missing = sorted(str(p.relative_to(ROOT)) for p in reached(stage)
                     if not any(p == d or d in p.parents for d in deps))
    assert not missing, f"stage {name} imports modules its dvc.yaml deps do not name: {missing}"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_deps_are_at_package_granularity(name: str) -> None:
    """No dep the stage does not need at package granularity, none finer than its unit."""
    declared = {d for d in STAGES[name].get("deps", []) if d.startswith("src/")}
    expected = expected_deps(STAGES[name])
    listing = "\n".join(f"      - {d}" for d in sorted(expected))
    assert declared == expected, (
        f"stage {name}: deps not needed at package granularity: {sorted(declared - expected)}; "
        f"missing: {sorted(expected - declared)}. Its code deps are:\n{listing}")


def test_a_stage_reaches_other_wings_only_through_their_declaration() -> None:
    """Of a wing that is not its own, a stage depends on the ``wing`` module, what it imports
    and the modules it names for the pipeline (section, claims, columns), with their imports:
    editing the rest of the wing re-runs its own stages only."""
    declared = {w: with_data(closure({f"lmrepro.{w}.wing"} | {
        m for f in DYNAMIC_FIELDS.values() for m in registered(f, w)})) for w in WING_PACKAGES}
    for name, stage in STAGES.items():
        own = own_wings(stage)
        for dep in expected_deps(stage):
            parts = Path(dep).relative_to("src/lmrepro").parts
            if len(parts) > 1 and parts[0] in WING_PACKAGES and parts[0] not in own:
                assert ROOT / dep in declared[parts[0]], (name, dep)


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
    reached_files = closure({"lmrepro.scape.stage"})
    assert PACKAGE / "optim" / "adams.py" in reached_files
    assert PACKAGE / "scape" / "train" / "trainer.py" in closure({"lmrepro.scape.train.worker"})
    # and the wings, which every stage's program installs
    assert PACKAGE / "rgc" / "wing.py" in closure(stage_roots(STAGES["analysis_rgc"]))
    assert registered("claims") == {"lmrepro.scape.claims", "lmrepro.rgc.claims"}
    assert PACKAGE / "rgc" / "claims.py" in closure({"lmrepro.pipeline.claims"})
    assert PACKAGE / "scape" / "config.py" in closure({"lmrepro.pipeline.params"})
    # and the package data a module reads (the SCAPE authors' logs, read by the claims)
    assert PACKAGE / "scape" / "data" in reached(STAGES["claims"])


def test_the_granularity_is_the_wing_for_its_stages_and_the_file_for_the_others() -> None:
    train_scape = expected_deps(STAGES["train_scape"])
    assert {"src/lmrepro/scape", "src/lmrepro/optim", "src/lmrepro/pipeline",
            "src/lmrepro/model.py", "src/lmrepro/rgc/wing.py"} <= train_scape
    assert "src/lmrepro/rgc" not in train_scape
    assert not any(d.startswith("src/lmrepro/scape/") for d in train_scape)
    # the claims stage runs no wing's code of its own: the claims modules, file by file, and the
    # authors' logs they read
    claims = expected_deps(STAGES["claims"])
    assert {"src/lmrepro/rgc/claims.py", "src/lmrepro/scape/claims.py",
            "src/lmrepro/scape/data"} <= claims
    assert not {"src/lmrepro/rgc", "src/lmrepro/scape"} & claims
