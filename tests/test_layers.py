"""The package's layering, checked from its source: imports point one way
(integrations -> run -> present -> judge -> measure -> core) and no module imports itself back
through others. `integrations` (the framework callbacks, optional extras) sits on top of run.

The one allowed upward edge is the display protocol: a result type's `_repr_html_` and
`__str__` (IPython and print look for them on the object) render it through `diagkit.present`,
lazily.

Inside `measure` and `run`, every module lives in a room (a sub-package), and a room imports
only the rooms of its layer listed for it in ROOMS (docs/development.md, "Layout: measure →
judge → present, with run on top"). No module imports another module's `_private` name, nor
reaches one through a module it imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = {"core": 0, "measure": 1, "judge": 2, "present": 3, "run": 4, "demos": 4,
          "integrations": 5}
DISPLAY_METHODS = {"_repr_html_", "__str__"}
# layer -> room -> the rooms of the same layer it may import (the arrows of docs/development.md)
ROOMS = {
    "measure": {"batched": set(), "tables": set(), "engines": set(), "checkpoints": set(),
                "origin": set(), "model": {"engines", "batched"}, "change": {"batched"},
                "step": {"batched", "change", "model", "engines", "tables"},
                "clock": {"step", "model", "tables"}},
    "run": {"target": set(), "trackers": set(), "diagnose": {"target"},
            "live": {"diagnose", "target"}, "workbook": {"diagnose", "target"},
            "watch": {"target", "diagnose", "live", "workbook", "trackers"},
            "cli": {"target", "diagnose", "workbook"}},
}


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


def room(module: str) -> tuple[str, str] | None:
    """(layer, room) of a module inside a layer with rooms, else None."""
    parts = module.split(".")
    return (parts[1], parts[2]) if len(parts) > 2 and parts[1] in ROOMS else None


def room_violations(root: Path) -> list[str]:
    """Modules of `measure` and `run` outside a known room (a flat file beside the rooms, or a
    room nobody named), and imports between rooms that ROOMS does not allow."""
    problems = []
    for layer_name, rooms in ROOMS.items():
        for path in sorted((root / "diagkit" / layer_name).rglob("*.py")):
            src = module_name(path, root)
            home = room(src)
            flat = path.parent.name == layer_name and path.name != "__init__.py"
            if flat or (home is not None and home[1] not in rooms):
                problems.append(f"{src} is in no room of {layer_name}")
                continue
            for target, _, line in imports(path, root):
                there = room(target)
                if home and there and there[0] == home[0] and there[1] != home[1] \
                        and there[1] not in rooms[home[1]]:
                    problems.append(f"{src}:{line} imports {target} (room {there[1]} is not "
                                    f"one {home[1]} may import)")
    return problems


def private_reach_ins(root: Path) -> list[str]:
    """`from x import _name` of another diagkit module, and `module._name` where `module` is
    a diagkit module the file imported: each reaches past that module's public surface."""
    problems = []
    for path in sorted((root / "diagkit").rglob("*.py")):
        src, tree = module_name(path, root), ast.parse(path.read_text())
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("diagkit")):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and not (root / Path(*src.split(".")[:-1]) / f"{alias.name}.py").exists():
                        problems.append(f"{src}:{node.lineno} imports {alias.name}")
                    bound.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in bound and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                problems.append(f"{src}:{node.lineno} reaches {node.value.id}.{node.attr}")
    return problems


def test_imports_point_one_way_and_never_cycle():
    assert layer_violations(SRC) == []


def test_each_room_imports_only_the_rooms_it_may():
    assert room_violations(SRC) == []


def test_no_module_reaches_into_another_modules_private_names():
    assert private_reach_ins(SRC) == []


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


def test_the_room_checker_catches_a_flat_file_and_a_forbidden_room(tiny_tree):
    measure = tiny_tree / "diagkit" / "measure"
    for name in ("batched", "step"):
        (measure / name).mkdir()
        (measure / name / "__init__.py").write_text("")
    (measure / "batched" / "kernels.py").write_text("from ..step import state\n")
    (measure / "step" / "state.py").write_text("from ..batched import kernels\n")
    problems = room_violations(tiny_tree)
    assert "diagkit.measure.observer is in no room of measure" in problems
    assert any(p.startswith("diagkit.measure.batched.kernels:1 imports diagkit.measure.step.state")
               for p in problems), problems
    assert not any("step.state:" in p for p in problems)


def test_the_private_checker_catches_both_reaches(tiny_tree):
    judge = tiny_tree / "diagkit" / "judge"
    (judge / "verdicts.py").write_text("from ..measure.observer import _hook\n")
    (judge / "rules.py").write_text("from ..measure import observer\nx = observer._hook\n")
    (judge / "own.py").write_text("from . import _own_private_module\n")
    (judge / "_own_private_module.py").write_text("")
    problems = private_reach_ins(tiny_tree)
    assert problems == ["diagkit.judge.rules:2 reaches observer._hook",
                        "diagkit.judge.verdicts:1 imports _hook"], problems
