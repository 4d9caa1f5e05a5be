"""The bench's imports point one way (benchmarks/README.md, "Layout"): the runner
(`benchmarks/overhead.py`) imports the sections, the sections and helper scripts import
`bench_common`, and nothing imports the runner. Read from the source with `ast`, nothing run:
a back-import (a helper taking `build` from the runner, as `fsdp_time` once did) made a circle
that only worked because of the order modules happened to load in."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RUNNER = "overhead"


def bench_modules() -> dict[str, Path]:
    """Each benchmark file by the name it is imported as (benchmarks/ is on sys.path when a
    bench runs): `watch_time`, `bench_common`, `sections.step_time`, `sections`."""
    found = {p.stem: p for p in BENCH.glob("*.py")}
    for p in (BENCH / "sections").glob("*.py"):
        found["sections" if p.stem == "__init__" else f"sections.{p.stem}"] = p
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The benchmark modules `path` imports, anywhere in it (a function's lazy import too)."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(p for p in [*parts, base] if p)
            targets = [base] + [f"{base}.{a.name}" if base else a.name for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import sections.watch.x` -> sections.watch
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = bench_modules()
    return {name: imported(name, path, set(modules)) for name, path in modules.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def test_the_graph_sees_the_bench():
    """The reader finds what is there: the runner imports the sections, a helper script
    imports bench_common (else the checks below would pass on an empty graph)."""
    graph = import_graph()
    assert {"sections.step_time", "sections.memory", "bench_common"} <= graph[RUNNER]
    assert "bench_common" in graph["fsdp_time"] and "bench_common" in graph["group_time"]
    assert "bench_common" in graph["sections.step_time"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_benchmark_file_imports_the_runner():
    importers = sorted(name for name, deps in import_graph().items() if RUNNER in deps)
    assert not importers, f"{importers} import benchmarks/{RUNNER}.py: import bench_common"


def test_no_circle_among_benchmark_files():
    circle = find_circle(import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_bench_common_imports_no_section():
    graph = import_graph()
    assert not {d for d in graph["bench_common"] if d.startswith("sections")}
