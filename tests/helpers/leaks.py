"""A pytest plugin (loaded by conftest.py): the suite fails if a process it started outlives it,
and what its processes leave in their temporary folder goes with the session.

At the start of a session, `DIAGKIT_TEST_SESSION` is set to a fresh value in this process's
environment, so every process the tests start inherits it (subprocesses, torchrun and its
ranks, which run in sessions of their own, kernels, browsers). At the end, any process still
carrying it, other than pytest itself, gets a short grace period to end; those still alive
are then killed and the session fails with their command lines. pytest-xdist's workers share
their controller's value (they are the session) and only the controller checks, once every
worker has ended. A nested pytest (a test that runs pytest) starts a session of its own.

Folders: the processes the tests start get a temporary folder of the session's own (`TMPDIR`),
removed at its end, so what torchrun, the ranks and the browsers leave there (torchrun's
`torchelastic_*` log folders, a Chromium's singleton folders) goes with it. The machine's
temporary folder is shared with other jobs: the session never looks there by name, never
deletes there, and never fails because of what appears there (docs/development.md, "Tests").
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid

import pytest

from jobs import carrying, kill_carrying

SESSION_MARKER = "DIAGKIT_TEST_SESSION"
_SCRATCH = pytest.StashKey[tuple]()  # (the session's temporary folder, TMPDIR before it)
GRACE_S = float(os.environ.get("DIAGKIT_TEST_LEAK_GRACE_S", "5"))  # the tests of it: less


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # an xdist worker


def pytest_configure(config):
    """Mark this session, and give the processes it starts a temporary folder of its own
    (`TMPDIR`), removed at its end: what torchrun, the ranks and the browsers leave there
    goes with it. Both before xdist starts its workers, which inherit them. This process keeps
    the machine's temporary folder (pytest's own `tmp_path` folders stay there, kept as pytest
    keeps them)."""
    if not _is_worker(config):
        os.environ[SESSION_MARKER] = uuid.uuid4().hex
        machine = tempfile.gettempdir()  # read, and kept by this process, before TMPDIR moves
        config.stash[_SCRATCH] = (tempfile.mkdtemp(prefix="diagkit-tests-", dir=machine),
                                  os.environ.get("TMPDIR"))
        os.environ["TMPDIR"] = config.stash[_SCRATCH][0]


@pytest.hookimpl(trylast=True)  # after xdist's own sessionfinish, which ends the workers
def pytest_sessionfinish(session):
    """Fail the session if any process it started is still alive (killed, then named); remove
    its temporary folder."""
    if _is_worker(session.config) or SESSION_MARKER not in os.environ:
        return
    tag = os.environ[SESSION_MARKER]
    # A process started a moment ago shows the environment its parent started with until it
    # has exec'd (no marker yet): give a loaded machine that moment before looking
    time.sleep(0.5)
    end = time.monotonic() + GRACE_S
    while carrying(SESSION_MARKER, tag) and time.monotonic() < end:
        time.sleep(0.1)
    left = kill_carrying(SESSION_MARKER, tag)
    if left:
        _fail(session, "processes left behind", [
            f"{len(left)} process(es) started by the tests outlived the session (killed now):",
            *(f"  pid {pid}: {cmd[:300]}" for pid, cmd in sorted(left.items()))])
    _remove_scratch(session)


def _remove_scratch(session) -> None:
    """Remove the session's temporary folder, with all its processes left there, and give
    TMPDIR back. Only this folder: nothing in the machine's is the session's to judge."""
    scratch, before = session.config.stash.get(_SCRATCH, (None, None))
    if scratch is None:
        return
    shutil.rmtree(scratch, ignore_errors=True)
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before


def _fail(session, title: str, lines: list[str]) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", title, red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print("\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
