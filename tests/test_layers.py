"""The layout explains the data flow: imports point one way, from the top (CLI, report) down to
the matrix, subjects and references, and no module imports itself round a circle. Read from the
source (every import, deferred ones inside functions included), not from what happens to be loaded."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top. A module may import its own layer and the layers below it, never one above.
LAYERS = [
    ("references",),
    ("parity.settings",),  # the run's settings (RunSettings): read by every layer above, imports none of them
    ("parity.hash_seed",),  # the entry points' PYTHONHASHSEED restart: imports nothing of the suite
    ("parity.observe",),
    # parity.axes: pure data, the registry the subjects' case values resolve their defaults from
    ("parity.subjects", "parity.mutation", "parity.axes"),
    ("parity.matrix",),
    ("parity.checks",),
    ("parity.harness",),
    ("parity.report",),
    ("parity.mutants", "parity.torchrun_launch", "parity.bench", "parity.scale", "parity.sensitivity", "parity.cli", "parity.explore"),
]


def layer_of(module: str) -> int | None:
    best = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (level, len(prefix))
    return None if best is None else best[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module the file imports, wherever the import statement stands (ast.walk: module level, inside
    functions and methods alike), and every importlib.import_module of a constant name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from parity.observe import collectives`
        elif (isinstance(node, ast.Call) and "import_module" in (getattr(node.func, "attr", None),
                                                                 getattr(node.func, "id", None))
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return {m for m in found if m.split(".")[0] in ("parity", "references")}


def graph() -> dict[str, set[str]]:
    sources = {module_name(p): p for d in ("parity", "references") for p in (ROOT / d).rglob("*.py")}
    return {m: {i for i in imports(p) if i in sources} for m, p in sources.items()}


def test_every_module_has_a_layer():
    # A package whose __init__ imports nothing (a docstring only) needs none: parity.
    assert [m for m, deps in graph().items() if layer_of(m) is None and deps] == []
    assert sorted(m for m in graph() if layer_of(m) is None) == ["parity"]


def test_imports_point_down():
    upward = [f"{m} (layer {layer_of(m)}) imports {i} (layer {layer_of(i)})"
              for m, deps in graph().items() if layer_of(m) is not None
              for i in sorted(deps) if layer_of(i) is not None and layer_of(i) > layer_of(m)]
    assert upward == []


def test_references_import_nothing_from_parity():
    assert {m: d for m, d in graph().items() if m.startswith("references") and any(
        i.startswith("parity") for i in d)} == {}


def test_no_import_cycles():
    g = graph()
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(g[node]):
            if nxt == node:
                continue
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_checker_sees_an_upward_import(tmp_path):
    """The rule can fail: a subject importing the harness is an upward import."""
    assert layer_of("parity.subjects.base") < layer_of("parity.harness.runner")
    assert layer_of("parity.mutation.catalog") < layer_of("parity.harness.rank_worker") < layer_of("parity.mutants")
    probe = tmp_path / "probe.py"
    probe.write_text("from parity.harness.runner import Runner\n")
    assert "parity.harness.runner" in imports(probe)
    # Deferred ones count the same: inside a method, and through importlib.
    probe.write_text("class S:\n    def run_rank(self):\n        from parity.report import html\n"
                     "        import importlib\n        importlib.import_module('parity.harness.placement')\n")
    assert {"parity.report", "parity.report.html", "parity.harness.placement"} <= imports(probe)


def test_a_package_is_one_layer():
    """Every module of a package sits in its package's layer, so an import between packages points the way the
    layers do (parity.mutation's check, which runs the harness, lives above it as parity.mutants)."""
    packages = {m for m in graph() if (ROOT / m.replace(".", "/") / "__init__.py").is_file()}
    split = [f"{m} (layer {layer_of(m)}) in {p} (layer {layer_of(p)})" for m in graph() for p in packages
             if m.startswith(p + ".") and layer_of(p) is not None and layer_of(m) != layer_of(p)]
    assert split == []
