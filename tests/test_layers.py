"""The package's layering, checked from its source: imports point one way
(integrations -> run -> present -> judge -> measure -> core) and no module imports itself back
through others. `integrations` (the framework callbacks, optional extras) sits on top of run.

The one allowed upward edge is the display protocol: a result type's `_repr_html_` and
`__str__` (IPython and print look for them on the object) render it through `diagkit.present`,
lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = {"core": 0, "measure": 1, "judge": 2, "present": 3, "run": 4, "demos": 4,
          "integrations": 5}
DISPLAY_METHODS = {"_repr_html_", "__str__"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    """The layer of a diagkit module; the package's own `__init__` sits above them all."""
    parts = module.split(".")
    if parts[0] != "diagkit":
        return None
    if len(parts) == 1:
        return max(LAYERS.values()) + 1
    return LAYERS.get(parts[1])


def imports(path: Path, root: Path) -> list[tuple[str, str, int]]:
    """(imported diagkit module, enclosing function or '', line) for every import in a file."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if isinstance(child, ast.Import):
                found.extend((a.name, function, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:  # `from . import x` may import a submodule
                    candidate = f"{base}.{alias.name}"
                    is_module = any((root / Path(*candidate.split("."))).with_suffix(s).exists()
                                    for s in (".py",)) or (root / Path(*candidate.split("."))
                                                           ).is_dir()
                    found.append((candidate if is_module else base, function, child.lineno))
            visit(child, inner)
    visit(tree, "")
    return [(m, f, line) for m, f, line in found if m.split(".")[0] == "diagkit"]


def layer_violations(root: Path) -> list[str]:
    """Upward imports and import cycles among the diagkit modules under `root`."""
    problems, graph = [], {}
    for path in sorted((root / "diagkit").rglob("*.py")):
        src = module_name(path, root)
        edges = graph.setdefault(src, set())
        for target, function, line in imports(path, root):
            if target == src:
                continue
            low, high = layer(src), layer(target)
            display = function in DISPLAY_METHODS and high == LAYERS["present"]
            if low is not None and high is not None and high > low and not display:
                problems.append(f"{src}:{line} imports {target} (layer {high} above {low})")
            if not display:
                edges.add(target)
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(graph)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected knot, found by depth-first search."""
    state, stack, cycles = {}, [], []

    def walk(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return cycles


def test_imports_point_one_way_and_never_cycle():
    assert layer_violations(SRC) == []


def test_every_module_belongs_to_a_layer():
    for path in (SRC / "diagkit").rglob("*.py"):
        name = module_name(path, SRC)
        assert layer(name) is not None, name


@pytest.fixture
def tiny_tree(tmp_path):
    """A miniature diagkit with one module per layer, importing only downwards."""
    pkg = tmp_path / "diagkit"
    for sub in ("core", "measure", "judge", "present", "run"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .run import api\n")
    (pkg / "core" / "result.py").write_text(
        "class R:\n    def _repr_html_(self):\n        from ..present import html\n")
    (pkg / "measure" / "observer.py").write_text("from ..core import result\n")
    (pkg / "judge" / "verdicts.py").write_text("from ..measure import observer\n")
    (pkg / "present" / "html.py").write_text("from ..judge import verdicts\n")
    (pkg / "run" / "api.py").write_text("from ..present import html\nimport diagkit.core.result\n")
    return tmp_path


def test_the_checker_passes_a_clean_tree(tiny_tree):
    assert layer_violations(tiny_tree) == []


def test_the_checker_catches_an_upward_import(tiny_tree):
    (tiny_tree / "diagkit" / "measure" / "observer.py").write_text(
        "from ..core import result\n\ndef f():\n    from ..judge import verdicts\n")
    problems = layer_violations(tiny_tree)
    assert any("diagkit.measure.observer:4 imports diagkit.judge.verdicts" in p for p in problems)


def test_the_checker_catches_a_cycle_within_a_layer(tiny_tree):
    (tiny_tree / "diagkit" / "judge" / "findings.py").write_text("from . import verdicts\n")
    (tiny_tree / "diagkit" / "judge" / "verdicts.py").write_text(
        "from ..measure import observer\nfrom .findings import x\n")
    problems = layer_violations(tiny_tree)
    assert any(p.startswith("import cycle:") and "diagkit.judge.findings" in p for p in problems)


def test_the_display_exception_is_only_for_repr_html(tiny_tree):
    (tiny_tree / "diagkit" / "core" / "result.py").write_text(
        "class R:\n    def render(self):\n        from ..present import html\n")
    assert layer_violations(tiny_tree)
