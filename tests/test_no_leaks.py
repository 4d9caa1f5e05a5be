"""The suite's own promise: no process started by the tests outlives the session
(tests/leaks.py), and a job run through tests/jobs.py leaves none of its ranks behind."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from browser import chromium
from cdp import Browser
from jobs import carrying, marked_here, run_job

HERE = Path(__file__).resolve().parent

LEAKY = '''
import subprocess

def test_leaks_a_sleep():
    subprocess.Popen(["sleep", "300"], start_new_session=True)  # nobody waits for it

def test_cleans_up():
    subprocess.run(["true"], check=True)
'''


def pytest_run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """A pytest session of its own, with the leak check, on a one-file suite."""
    (tmp_path / "test_inner.py").write_text(body)
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "DIAGKIT_TEST_LEAK_GRACE_S": "1", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "leaks", "-q", "-p",
                           "no:cacheprovider", "test_inner.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_session_that_leaks_a_process_fails_and_names_it(tmp_path):
    done = pytest_run(tmp_path, LEAKY)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "2 passed" in done.stdout  # every test passed: it is the leak that fails it
    assert "1 process(es) started by the tests outlived the session" in done.stdout
    assert "sleep 300" in done.stdout
    survivors = [pid for pid, cmd in carrying("DIAGKIT_TEST_SESSION",
                                              os.environ["DIAGKIT_TEST_SESSION"]).items()
                 if cmd == "sleep 300"]
    assert survivors == []  # and it was killed: the inner session marked it as its own
    # (a session that leaks nothing passes: this suite's own run shows it)


GRANDCHILD = """
import pathlib, subprocess, sys, time
sleep = subprocess.Popen(["sleep", "301"], start_new_session=True)
pathlib.Path(sys.argv[1]).write_text(str(sleep.pid))
time.sleep(300)
"""


def test_run_job_kills_the_processes_that_left_its_session(tmp_path):
    """What torchrun does with its ranks: a child in a session of its own, which killing the
    launcher's process group misses, and which holds the launcher's pipes open. run_job
    kills it too (here on a timeout) and returns once it is gone."""
    started, pid_file = time.monotonic(), tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_job([sys.executable, "-c", GRANDCHILD, str(pid_file)], timeout=6)
    assert time.monotonic() - started < 30
    pid = int(pid_file.read_text())  # it was started
    assert not Path(f"/proc/{pid}").exists() or b"sleep" not in \
        Path(f"/proc/{pid}/cmdline").read_bytes()


def test_marked_here_sees_only_its_own_processes():
    other = subprocess.Popen(["sleep", "302"])  # not of the marked job
    try:
        with marked_here() as tag:
            mine = subprocess.Popen(["sleep", "303"], start_new_session=True)
            assert list(carrying("DIAGKIT_TEST_JOB", tag)) == [mine.pid]
        assert mine.wait(timeout=10) == -9  # killed on leaving
        assert other.poll() is None  # the unmarked process is not touched
    finally:
        other.kill()
        other.wait()


LEAVES_A_FOLDER = '''
import pathlib, tempfile

def test_leaves_a_browser_folder():
    (pathlib.Path(tempfile.gettempdir()) / "org.chromium.Chromium.diagkit-test").mkdir()
'''


def test_a_session_that_leaves_a_browser_folder_fails_and_removes_it(tmp_path):
    # the temporary folder the inner session's processes see: this session's own (leaks.py)
    folder = Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / \
        "org.chromium.Chromium.diagkit-test"
    done = pytest_run(tmp_path, LEAVES_A_FOLDER)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 passed" in done.stdout
    assert "1 folder(s) a browser or torchrun of the tests left in the temporary folder" in \
        done.stdout
    assert str(folder) in done.stdout and not folder.exists()


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed")
def test_a_browser_of_the_tests_leaves_nothing_in_the_temporary_folder():
    """Chromium ended by the tests (terminated, not closed from its menu) left a singleton
    folder in /tmp per launch; its temporary folder is now inside its profile."""
    singletons = lambda: set(Path(tempfile.gettempdir()).glob("org.chromium.Chromium.*"))  # noqa: E731
    before = singletons()
    with Browser(400, 300) as browser:
        assert browser.evaluate("1 + 1") == 2
    assert singletons() - before == set()
