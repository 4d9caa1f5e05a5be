"""A pytest plugin (loaded by conftest.py): how the suite is split into tiers and spread over
pytest-xdist's workers (docs/development.md, "Tests": `make test`, `make test-fast`).

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
QUICK_E2E = {"e2e/test_zoo.py", "e2e/test_zoo_updates.py", "e2e/test_zoo_optimizers.py",
             "e2e/test_zoo_loops.py"}
# Unit tests (by nodeid prefix, relative to tests/) that run whole jobs in other processes: the
# console script, papermill / nbclient kernels, a browser.
SLOW_UNIT = (
    "run/cli/test_cli.py", "run/cli/test_faults.py", "run/cli/test_faults_signals.py",
    "run/cli/test_faults_timeouts.py", "run/workbook/test_workbook.py", "run/workbook/test_report.py",
    "run/workbook/test_report_from.py", "run/workbook/test_report_env.py", "run/workbook/test_notebook_errors.py",
    "run/workbook/test_notebook_stale.py",
    "run/target/test_paths.py",
    "run/diagnose/test_optimizer_source.py::test_meta_memory_under_two_ranks_carries_the_source_to_rank_0",
    "run/diagnose/test_meta.py::test_a_2b_parameter_model_costs_no_parameter_memory",
    "run/diagnose/test_meta.py::test_the_notebook_runs_a_target_on_meta",
    "run/diagnose/test_try_fix.py::test_the_notebook_cell_shows_the_preview",
    "run/target/test_target_folder.py::test_cli_check_of_a_file_target_with_a_sibling_import",
    "run/workbook/test_printed.py::test_the_report_shows_printed_lines_last_and_folded",
    "present/test_explorer_fixes.py::test_picker_never_points_past_its_options_in_the_browser",
    "present/test_source_wrapping.py",
    "test_no_leaks.py::test_a_browser_of_the_tests_leaves_nothing_in_the_temporary_folder",
)


def is_slow(item: pytest.Item) -> bool:
    """The tier of one test (see the module's docstring)."""
    try:
        rel = Path(str(item.path)).resolve().relative_to(HERE).as_posix()
    except ValueError:  # a test outside tests/ (tests/test_suite_plan.py's inner suite)
        return False
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


def pytest_runtest_logreport(report):
    """DIAGKIT_TEST_DURATIONS=FILE: each phase's seconds, appended as it ends (under xdist, by
    the controller), so that a run cut short still tells where its time went."""
    path = os.environ.get("DIAGKIT_TEST_DURATIONS")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as f:
            f.write(f"{report.duration:8.2f} {report.when:8s} {report.outcome:7s} "
                    f"{report.nodeid}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """DIAGKIT_TEST_CPU=FILE: each test's CPU seconds (user + sys), its own process and the
    processes it started and waited for, appended by the worker that ran it: where the suite's
    CPU goes, which is what a busy neighbour takes from (benchmarks/README.md)."""
    path = os.environ.get("DIAGKIT_TEST_CPU")
    before = _cpu() if path else 0.0
    yield
    if path:
        with open(path, "a") as f:
            f.write(f"{_cpu() - before:8.2f} {item.nodeid}\n")


def _cpu() -> float:
    """User + system seconds of this process and its waited-for children."""
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_configure(config):
    """One compute thread per xdist worker, for it and the processes it starts."""
    if hasattr(config, "workerinput"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        torch.set_num_threads(1)
