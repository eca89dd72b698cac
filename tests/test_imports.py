"""The import graph of the package: no import cycle between its files, none between its units
(a subpackage such as ``lmrepro.pipeline``, or a top-level module such as ``lmrepro.stats``), and
dependencies that point downwards from the wings.

Every import of a module counts, at module level or inside a function (a lazy import hides a cycle
from the interpreter, not from the design), and so does every module named by a string: an
argument of ``importlib.import_module`` or ``__import__``, a package's lazy exports
(``_EXPORTS``), a module a wing's value names (``claims="lmrepro.scape.claims"``, a section's
``"module:Class"``, a command's module) or a worker program (``-m lmrepro.scape.train.worker``): a
string constant that is exactly a module of the package, with or without ``:Name``.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lmrepro"

#: The import cycles between units the package still has, each as the units in import order
#: from the first by name (``("data", "pipeline")``: data imports pipeline, which imports data;
#: names without ``lmrepro.``). A new cycle fails the test, and so does an entry that no longer
#: exists, so the list only shrinks.
KNOWN_CYCLES: set[tuple[str, ...]] = set()

#: the wings: they import the pipeline and the shared parts, which import none of them
WINGS = ("lmrepro.baseline", "lmrepro.scape", "lmrepro.rgc")
#: the shared parts below the wings (``lmrepro.wings`` and ``lmrepro.cli`` compose them)
SHARED = ("lmrepro.pipeline", "lmrepro.results", "lmrepro.data", "lmrepro.model",
          "lmrepro.optim", "lmrepro.stats", "lmrepro.evaluation", "lmrepro.config",
          "lmrepro.paramfile", "lmrepro.harness", "lmrepro.backprop", "lmrepro.bench",
          "lmrepro.checkpoints")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str | None:
    """The unit of ``lmrepro.x.y``: ``lmrepro.x`` when ``x`` is a subpackage or a top-level
    module, ``lmrepro`` for the package's own ``__init__``; None outside the package."""
    parts = module.split(".")
    if parts[0] != "lmrepro":
        return None
    if len(parts) > 1 and ((PACKAGE / parts[1]).is_dir()
                           or (PACKAGE / f"{parts[1]}.py").exists()):
        return f"lmrepro.{parts[1]}"
    return "lmrepro"


#: a string naming a module of the package (``lmrepro.x.y``, or ``lmrepro.x.y:Name``)
MODULE_STRING = re.compile(r"(lmrepro(?:\.\w+)+)(?::\w+)?")
#: a module named inside a string of code (``__import__('lmrepro.x', ...)``)
IMPORT_IN_CODE = re.compile(r"(?:__import__|import_module)\(\s*['\"](lmrepro(?:\.\w+)+)['\"]")


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[str]:
    """The modules the module ``module`` (with ``source``) imports, absolute (relative imports
    resolved), by statement or by string; ``from pkg import name`` yields ``pkg.name`` too, for
    the case where ``name`` is a module, and ``pkg`` unless every name is a submodule (importing
    a submodule runs the package's ``__init__`` whoever imports it: no edge of its own)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{alias.name}" for alias in node.names]
            if not all(is_module(n) for n in names):   # a name of the package, not a submodule
                yield base
            yield from names
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if found := MODULE_STRING.fullmatch(node.value):
                yield found.group(1)
            yield from IMPORT_IN_CODE.findall(node.value)
        elif (isinstance(node, ast.Assign) and is_package
              and any(getattr(t, "id", "") == "_EXPORTS" for t in node.targets)):
            yield from (f"{module}.{sub}" for sub in ast.literal_eval(node.value).values())


def imported_modules(path: Path) -> Iterator[str]:
    """The modules the file ``path`` imports (:func:`imports_of`)."""
    yield from imports_of(path.read_text(encoding="utf-8"), module_name(path),
                          path.name == "__init__.py")


def is_module(name: str) -> bool:
    rel = PACKAGE.parent.joinpath(*name.split("."))
    return rel.with_suffix(".py").exists() or (rel / "__init__.py").exists()


@functools.cache
def module_graph() -> dict[str, set[str]]:
    """``module -> modules of the package it imports`` (read once: the tests only read it)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        graph[name] = {m for m in imported_modules(path)
                       if m.startswith("lmrepro") and is_module(m) and m != name}
    return graph


def unit_graph() -> dict[tuple[str, str], set[str]]:
    """``(unit, unit it imports) -> the importing modules``, between different units."""
    edges: dict[tuple[str, str], set[str]] = {}
    for module, targets in module_graph().items():
        for target in targets:
            a, b = unit_of(module), unit_of(target)
            if a and b and a != b:
                edges.setdefault((a, b), set()).add(module)
    return edges


def cycles(edges: set[tuple[str, str]]) -> set[tuple[str, ...]]:
    """Every elementary cycle of a small graph, each from its smallest node (a depth-first search
    from each node through larger nodes only, so each cycle is found once)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
    found: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for w in graph.get(path[-1], []):
            if w == path[0]:
                found.add(tuple(path))
            elif w > path[0] and w not in path:
                walk([*path, w])

    for v in sorted(graph):
        walk([v])
    return found


def file_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected part of ``graph`` that has one (no
    cycle: an empty list), each from its smallest module, in import order."""
    found = []
    for part in strongly_connected(graph):
        start = min(part)
        paths = {start: [start]}
        todo = [start]
        while todo:                          # breadth first, inside the part
            here = todo.pop(0)
            for there in sorted(graph.get(here, ())):
                if there == start:
                    found.append(paths[here])
                    todo = []
                    break
                if there in part and there not in paths:
                    paths[there] = [*paths[here], there]
                    todo.append(there)
    return sorted(found)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of ``graph`` with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        part.add(top)
                        if top == node:
                            break
                    if len(part) > 1:
                        parts.append(part)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return parts


def short(name: str) -> str:
    return name.removeprefix("lmrepro.")


def test_the_graph_sees_module_level_and_lazy_imports() -> None:
    graph = module_graph()
    assert "lmrepro.pipeline.runs" in graph["lmrepro.pipeline.analysis"]       # module level
    assert "lmrepro.pipeline.plots" in graph["lmrepro.pipeline.analysis"]      # in a function
    assert "lmrepro.pipeline.params" in graph["lmrepro.cli"]                   # in a function
    assert unit_of("lmrepro.pipeline.analysis") == "lmrepro.pipeline"
    assert unit_of("lmrepro.stats") == "lmrepro.stats" and unit_of("lmrepro") == "lmrepro"
    assert cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("b", "a")}) == {
        ("a", "b", "c"), ("a", "b")}


def test_the_graph_follows_import_strings() -> None:
    graph = module_graph()
    assert "lmrepro.scape.claims" in graph["lmrepro.scape.wing"]           # a wing's value
    assert "lmrepro.scape.config" in graph["lmrepro.scape.wing"]           # "module:Class"
    assert "lmrepro.scape.train.worker" in graph["lmrepro.scape.train.launch"]   # worker program
    assert "lmrepro.rgc.executors.runner" in graph["lmrepro.rgc"]          # lazy exports
    assert "lmrepro.lifetime" in graph["lmrepro.pipeline.notebook"]        # __import__ in code
    source = ("import importlib\n"
              "def f():\n"
              "    return importlib.import_module('lmrepro.b'), 'not lmrepro.c', 'lmrepro.d:E'\n")
    assert set(imports_of(source, "lmrepro.a")) == {"importlib", "lmrepro.b", "lmrepro.d"}
    assert file_cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}) == [
        ["a", "b", "c"]]
    assert file_cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}, "x": {"y"}, "y": {"x"}}) == [
        ["a", "b"], ["x", "y"]]


def test_no_import_cycle_between_files() -> None:
    """No module reaches itself through imports (at any level) or import strings: a shared
    piece two modules need lives below both (e.g. the SCAPE worker's flags in
    ``scape/train/worker.py``, which both its launcher and the ``lmrepro`` subcommands import)."""
    found = file_cycles(module_graph())
    assert not found, "import cycles between files: " + "; ".join(
        " -> ".join(short(m) for m in (*c, c[0])) for c in found)


def test_no_import_cycle_between_units_but_the_known_ones() -> None:
    edges = unit_graph()
    found = cycles({(short(a), short(b)) for a, b in edges})
    gone = sorted(KNOWN_CYCLES - found)
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES: {gone}"
    new = sorted(found - KNOWN_CYCLES)
    assert not new, "new import cycles between units: " + "; ".join(
        " -> ".join(c) + " (" + ", ".join(
            f"{a} -> {b} in {sorted(edges[f'lmrepro.{a}', f'lmrepro.{b}'])}"
            for a, b in zip(c, (*c[1:], c[0]), strict=True)) + ")" for c in new)


def test_no_import_cycle_between_the_pipeline_modules() -> None:
    """Inside ``lmrepro.pipeline`` too: e.g. ``analysis`` imports ``plots``, which imports the
    analysis' parts (runs, comparisons, resources, records), never ``analysis``."""
    edges = {(a, b) for a, targets in module_graph().items() for b in targets
             if a != b and a.startswith("lmrepro.pipeline.") and b.startswith("lmrepro.pipeline.")}
    assert not cycles(edges)


def test_dependencies_point_downwards_from_the_wings() -> None:
    """The pipeline and the other shared parts import no wing (each wing declares a value the
    composition, ``lmrepro.wings``, hands to ``lmrepro.pipeline.registry.install``), and no
    wing imports another."""
    upward = sorted((short(a), short(b), sorted(m)) for (a, b), m in unit_graph().items()
                    if a in SHARED and b in WINGS)
    assert not upward, f"shared parts import wings: {upward}"
    across = sorted((short(a), short(b), sorted(m)) for (a, b), m in unit_graph().items()
                    if a in WINGS and b in WINGS)
    assert not across, f"a wing imports another: {across}"


def test_a_scape_worker_loads_no_other_wing() -> None:
    """The launcher's worker entry (``python -m lmrepro.scape.train.worker``) imports neither the
    RGC or baseline wing nor the pipeline: every torchrun worker pays only for what it runs."""
    import subprocess
    import sys

    from lmrepro.scape.train.launch import ENTRY

    code = ("import runpy, sys; sys.argv = ['x', '--help']\n"
            f"try: runpy.run_module({ENTRY[1]!r}, run_name='__main__')\n"
            "except SystemExit: pass\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('lmrepro'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")[-2].split()
    assert "lmrepro.scape.config" in out
    loaded = [m for m in out if m.startswith(("lmrepro.rgc", "lmrepro.baseline",
                                                  "lmrepro.pipeline", "lmrepro.wings"))]
    assert not loaded, loaded
