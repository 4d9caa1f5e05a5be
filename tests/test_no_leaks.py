"""The suite's own promise: no process started by the tests outlives the session
(tests/helpers/leaks.py), and a job run through tests/helpers/jobs.py leaves none of its ranks
behind."""

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


def pytest_run(tmp_path: Path, body: str, **env_extra: str) -> subprocess.CompletedProcess:
    """A pytest session of its own, with the leak check, on a one-file suite."""
    (tmp_path / "test_inner.py").write_text(body)
    path = os.pathsep.join(p for p in (str(HERE / "helpers"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "DIAGKIT_TEST_LEAK_GRACE_S": "1", "PYTHONPATH": path, **env_extra}
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
            # Until its exec, /proc shows the child with the environment this process started
            # with (no tag yet): on a loaded machine that lasts a while (CI). Wait for the exec.
            deadline = time.monotonic() + 30
            while not carrying("DIAGKIT_TEST_JOB", tag) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert list(carrying("DIAGKIT_TEST_JOB", tag)) == [mine.pid]
        assert mine.wait(timeout=10) == -9  # killed on leaving
        assert other.poll() is None  # the unmarked process is not touched
    finally:
        other.kill()
        other.wait()


LEAVES_A_FOLDER = '''
import os, subprocess, sys, time

MAKES = ("import pathlib, tempfile; t = pathlib.Path(tempfile.gettempdir()); "
         "[(t / n).mkdir() for n in ('org.chromium.Chromium.diagkit-test', "
         "'torchelastic_diagkit_test')]")

def test_leaves_a_browser_folder_while_another_job_makes_its_own():
    # a process of the session's: a Chromium's and torchrun's leftovers in its temporary folder
    subprocess.run([sys.executable, "-c", MAKES], check=True)
    deadline = time.monotonic() + 30  # the other job makes its folders meanwhile
    while not os.path.exists(os.environ["OTHER_JOB_DONE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
'''

OTHER_JOB = '''
import pathlib, sys, time
machine = pathlib.Path(sys.argv[1])
time.sleep(0.5)  # while the inner session runs
for name in ("org.chromium.Chromium.other-job", "torchelastic_other_job"):
    (machine / name).mkdir()
pathlib.Path(sys.argv[2]).write_text("done")
'''


def test_a_session_leaves_other_jobs_folders_alone_and_takes_its_own_with_it(tmp_path):
    """An unrelated job (no session marker, its own environment) makes a browser's and
    torchrun's folders in the machine's temporary folder while an inner session runs, whose
    own processes make theirs: the inner session passes, the other job's folders are still
    there (never deleted, never a failure), and its own went with its temporary folder."""
    # The inner session's machine: a temporary folder of this test's own, so that the other
    # job's folders appear where no parallel test looks (one checking that a browser left
    # nothing in the suite's temporary folder saw them there: CI)
    machine = tmp_path / "machine"
    machine.mkdir()
    done_flag = tmp_path / "other-done"
    env = {k: v for k, v in os.environ.items() if k not in ("DIAGKIT_TEST_SESSION", "TMPDIR")}
    other = subprocess.Popen([sys.executable, "-c", OTHER_JOB, str(machine), str(done_flag)],
                             env=env)
    theirs = [machine / "org.chromium.Chromium.other-job", machine / "torchelastic_other_job"]
    try:
        os.environ["OTHER_JOB_DONE"] = str(done_flag)
        try:
            done = pytest_run(tmp_path, LEAVES_A_FOLDER, TMPDIR=str(machine))
        finally:
            os.environ.pop("OTHER_JOB_DONE", None)
        other.wait(timeout=60)
        assert done.returncode == 0, done.stdout[-3000:]
        assert "1 passed" in done.stdout and "left behind" not in done.stdout
        assert all(folder.is_dir() for folder in theirs)  # another job's: untouched
        mine = [machine / "org.chromium.Chromium.diagkit-test",
                machine / "torchelastic_diagkit_test"]
        assert not any(folder.exists() for folder in mine)  # in the inner's TMPDIR: gone
    finally:
        other.kill()
        for folder in theirs:  # this test made them: it removes them
            if folder.is_dir():
                folder.rmdir()


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed")
def test_a_browser_of_the_tests_leaves_nothing_in_the_temporary_folder():
    """Chromium ended by the tests (terminated, not closed from its menu) left a singleton
    folder in /tmp per launch; its temporary folder is now inside its profile."""
    singletons = lambda: set(Path(tempfile.gettempdir()).glob("org.chromium.Chromium.*"))  # noqa: E731
    before = singletons()
    with Browser(400, 300) as browser:
        assert browser.evaluate("1 + 1") == 2
    assert singletons() - before == set()
