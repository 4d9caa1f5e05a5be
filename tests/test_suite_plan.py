"""The suite's own plan (tests/suite_plan.py): under `make test`'s `-n 2 --dist loadgroup`, a
module whose tests share a module-scoped fixture runs on one worker, so the fixture is built
once. pytest 9.2 silently broke this with pytest-xdist 3.8 (xdist's renamed node ids are
ignored: pytest-xdist issue 1386): every torchrun job and papermill report of a module fixture
ran twice, and the suite took minutes longer. constraints.txt pins a pytest that groups."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SHARED = '''
import os, pytest

@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILDS"], "a") as f:
        f.write(__name__ + "\\n")   # one line per build of this module's fixture

@pytest.mark.parametrize("i", range(6))
def test_uses_it(built, i):
    pass
'''
PLAIN = '''
import pytest

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass
'''


def test_a_module_fixture_is_built_once_under_two_workers(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import suite_plan\n"
        "pytest_collection_modifyitems = suite_plan.pytest_collection_modifyitems\n")
    for name in ("test_shared_a.py", "test_shared_b.py"):
        (tmp_path / name).write_text(SHARED)
    (tmp_path / "test_plain.py").write_text(PLAIN)  # no fixture: not grouped
    builds = tmp_path / "builds.txt"
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-v"], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": path, "BUILDS": str(builds)})
    assert done.returncode == 0, done.stdout[-3000:]
    assert "18 passed" in done.stdout
    assert sorted(builds.read_text().split()) == ["test_shared_a", "test_shared_b"], (
        "a module fixture was built once per worker: xdist did not group its tests")
    grouped = [line for line in done.stdout.splitlines() if "test_shared_a.py" in line]
    assert grouped and all("@test_shared_a.py" in line for line in grouped)  # its group
