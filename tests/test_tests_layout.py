"""The tests mirror the package (docs/development.md, "Tests"): a unit test of a room of
`measure` or `run` sits in tests/<layer>/<room>/, and what several test modules share lives in
tests/helpers/, never in another test module or in conftest.py (a test module imported by
another runs its module-level setup twice, and works only when its folder happens to be on
sys.path)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "diagkit"


def shared_from_tests(root: Path) -> list[str]:
    """Imports of a test module (`test_*`) or of conftest, by any test file under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(root)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[0].startswith("test_") or n.split(".")[0] == "conftest"]
    return found


def misplaced_unit_tests(tests: Path, src: Path) -> list[str]:
    """Unit tests of `measure` and `run` outside a folder named for one of their rooms."""
    wrong = []
    for layer in ("measure", "run"):
        rooms = {p.name for p in (src / layer).iterdir() if (p / "__init__.py").is_file()}
        for path in sorted((tests / layer).rglob("test_*.py")):
            if path.parent.name not in rooms or path.parent.parent != tests / layer:
                wrong.append(str(path.relative_to(tests)))
    return wrong


def test_no_test_module_imports_another_or_conftest():
    assert shared_from_tests(TESTS) == []


def test_unit_tests_of_measure_and_run_sit_in_their_rooms():
    assert misplaced_unit_tests(TESTS, SRC) == []


def test_the_checks_see_a_shared_import_and_a_misplaced_test(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "test_one.py").write_text("from test_two import x\nfrom conftest import T\n")
    assert shared_from_tests(tmp_path) == ["a/test_one.py:1 imports test_two",
                                           "a/test_one.py:2 imports conftest"]
    for folder in ("src/measure/step", "tests/measure/step", "tests/measure/nowhere"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "src/measure/step/__init__.py").write_text("")
    (tmp_path / "src/run").mkdir()
    (tmp_path / "tests/run").mkdir()
    (tmp_path / "tests/measure/step/test_ok.py").write_text("")
    (tmp_path / "tests/measure/nowhere/test_lost.py").write_text("")
    (tmp_path / "tests/measure/test_flat.py").write_text("")
    assert misplaced_unit_tests(tmp_path / "tests", tmp_path / "src") == [
        "measure/nowhere/test_lost.py", "measure/test_flat.py"]
