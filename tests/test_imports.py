"""The import graph of the package: no cycle between its units (a subpackage such as
``lmrepro.pipeline``, or a top-level module such as ``lmrepro.stats``) but the known ones listed
below, and none between the modules of ``lmrepro.pipeline``.

Every ``import`` and ``from ... import`` of every module counts, at module level or inside a
function (a lazy import hides a cycle from the interpreter, not from the design); dynamic imports
(``importlib.import_module``) do not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lmrepro"

#: The import cycles between units the package still has, each as the units in import order
#: from the first by name (``("data", "pipeline")``: data imports pipeline, which imports data;
#: names without ``lmrepro.``). None is left since issue 17: the wings register their roles,
#: pairings, parameter sections and claims with ``lmrepro.pipeline.registry`` and
#: ``lmrepro.wings`` (above both) imports them; data.cli gets its parameter loader from the
#: ``lmrepro`` command. A new cycle fails the test, and so does an entry that no longer exists,
#: so the list only shrinks.
KNOWN_CYCLES: set[tuple[str, ...]] = set()

#: the wings: they import the pipeline and the shared parts, which import none of them
WINGS = ("lmrepro.baseline", "lmrepro.scape", "lmrepro.rgc")
#: the shared parts below the wings (``lmrepro.wings`` and ``lmrepro.cli`` compose them)
SHARED = ("lmrepro.pipeline", "lmrepro.results", "lmrepro.data", "lmrepro.model",
          "lmrepro.optim", "lmrepro.stats", "lmrepro.evaluation", "lmrepro.config",
          "lmrepro.paramfile", "lmrepro.harness", "lmrepro.backprop")


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


def imported_modules(path: Path) -> Iterator[str]:
    """The modules ``path`` imports, absolute (relative imports resolved); ``from pkg import
    name`` yields ``pkg.name`` too, for the case where ``name`` is a module."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def is_module(name: str) -> bool:
    rel = PACKAGE.parent.joinpath(*name.split("."))
    return rel.with_suffix(".py").exists() or (rel / "__init__.py").exists()


def module_graph() -> dict[str, set[str]]:
    """``module -> modules of the package it imports``."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        graph[module_name(path)] = {m for m in imported_modules(path)
                                    if m.startswith("lmrepro") and is_module(m)}
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
    """The pipeline and the other shared parts import no wing (the wings register with the
    pipeline instead: ``lmrepro.pipeline.registry``), and no wing imports another."""
    upward = sorted((short(a), short(b), sorted(m)) for (a, b), m in unit_graph().items()
                    if a in SHARED and b in WINGS)
    assert not upward, f"shared parts import wings: {upward}"
    across = sorted((short(a), short(b), sorted(m)) for (a, b), m in unit_graph().items()
                    if a in WINGS and b in WINGS)
    assert not across, f"a wing imports another: {across}"


def test_a_scape_worker_loads_no_other_wing() -> None:
    """The launcher's worker entry (``python -m lmrepro.scape.cli``) imports neither the RGC or
    baseline wing nor the pipeline: every torchrun worker pays only for what it runs."""
    import subprocess
    import sys

    from lmrepro.scape.launch import ENTRY

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
