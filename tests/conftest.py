"""The helpers the tests share live in tests/helpers/ (the shared models, the jobs, the command
line in this process, the browser, ...): a plain folder, not a package, that this file puts
first on sys.path, so a test imports them by their own names (`from models import MLP`). A
program a test starts in another process that imports them gets tests/helpers on its
PYTHONPATH (or as the folder of its script).

The session also fails if any process the tests started outlives it (tests/helpers/leaks.py);
the tiers and the spreading over xdist's workers are in tests/suite_plan.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))  # before the imports below: leaks and samples live there
import leaks  # noqa: E402 (tests/helpers/, on sys.path above)
import suite_plan  # noqa: E402
from samples import demo  # noqa: E402


def pytest_configure(config):
    leaks.pytest_configure(config)  # mark every process the session starts
    suite_plan.pytest_configure(config)  # one thread per xdist worker


pytest_sessionfinish = leaks.pytest_sessionfinish  # no process outlives the session
pytest_collection_modifyitems = suite_plan.pytest_collection_modifyitems  # tiers, groups
pytest_runtest_logreport = suite_plan.pytest_runtest_logreport  # DIAGKIT_TEST_DURATIONS=FILE
pytest_runtest_protocol = suite_plan.pytest_runtest_protocol  # DIAGKIT_TEST_CPU=FILE


# --------------------------------------------------------------- the demos, diagnosed once
@pytest.fixture(scope="session")
def meta():
    return demo("meta_memory")


@pytest.fixture(scope="session")
def finetune():
    return demo("finetune_heads")


@pytest.fixture(scope="session")
def clean():
    return demo("clean")
