"""A pytest plugin (loaded by conftest.py): how the suite is split into tiers and spread over
pytest-xdist's workers (README, "Development": `make test`, `make test-fast`).

- **Tiers.** A test is `slow` when it runs whole jobs in other processes (torchrun, papermill,
  a browser, a wheel build, the CLI in a subprocess): every test of tests/e2e/ and
  tests/integrations/ but the quick modules named below, and the unit tests named in
  SLOW_UNIT. `make test-fast` runs `-m "not slow"`; `make test` runs everything.
- **Workers.** Under `-n N --dist loadgroup`, the tests of a module that uses a module- or
  class-scoped fixture (a torchrun job, a built model, a server) stay together on one worker,
  so the fixture is built once; the other tests are spread one by one. Each worker computes
  with one thread (two workers on two cores would otherwise fight over them).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WHOLE_JOB_DIRS = ("e2e", "integrations")
# Modules of tests/e2e/ and tests/integrations/ that only run diagkit in this process, quickly.
QUICK_E2E: set[str] = set()
# Unit tests (by nodeid prefix, relative to tests/) that run whole jobs in subprocesses.
SLOW_UNIT: tuple[str, ...] = ()


def is_slow(item: pytest.Item) -> bool:
    """The tier of one test (see the module's docstring)."""
    rel = Path(str(item.path)).resolve().relative_to(HERE).as_posix()
    if rel.split("/")[0] in WHOLE_JOB_DIRS:
        return rel not in QUICK_E2E
    nodeid = rel + item.nodeid.split(".py", 1)[1] if ".py" in item.nodeid else rel
    return any(nodeid.startswith(prefix) for prefix in SLOW_UNIT)


def shares_a_fixture(item: pytest.Item) -> bool:
    """The test uses a fixture built once per module or class (its module stays together)."""
    defs = getattr(item, "_fixtureinfo", None)
    if defs is None:
        return False
    return any(d.scope in ("module", "class", "package")
               for fixture_defs in defs.name2fixturedefs.values() for d in fixture_defs)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark the slow tier, and group the tests that share a module's fixtures."""
    for item in items:
        if is_slow(item) and "slow" not in item.keywords:
            item.add_marker(pytest.mark.slow)
        if shares_a_fixture(item) and not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(Path(str(item.path)).name))


def pytest_configure(config):
    """One compute thread per xdist worker, for it and the processes it starts."""
    if hasattr(config, "workerinput"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        torch.set_num_threads(1)
