"""No code from data or params is ever executed: a static check over the package sources.

Checkpoints load with ``torch.load(..., weights_only=True)``; YAML with ``safe_load``; no pickle,
eval or exec anywhere in ``src/lmrepro``. A new call site that breaks this fails here.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "lmrepro"


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def test_no_unsafe_deserialisation_or_eval():
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                if any(n.split(".")[0] in ("pickle", "dill", "cloudpickle", "marshal")
                       for n in names):
                    problems.append(f"{path}:{node.lineno}: imports a pickle-like module")
        for node, name in calls(tree):
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            if name in ("eval", "exec"):
                problems.append(f"{where}: {name}()")
            if name == "torch.load":
                kw = {k.arg: k.value for k in node.keywords}
                ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value
                if not ok:
                    problems.append(f"{where}: torch.load without weights_only=True")
            if name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load"):
                problems.append(f"{where}: {name} (use yaml.safe_load)")
            if name.endswith("np.load") or name.endswith("numpy.load"):
                kw = {k.arg: k.value for k in node.keywords}
                if isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value:
                    problems.append(f"{where}: np.load(allow_pickle=True)")
    assert not problems, "\n".join(problems)


def test_the_check_sees_torch_load_calls():
    # guard against a vacuous pass: the package does load checkpoints, through one helper
    sources = "\n".join(p.read_text() for p in SRC.rglob("*.py"))
    assert "torch.load(" in sources and "weights_only=True" in sources
