"""Bad input the `diagkit` console script met in issue 36 (R11, R18): each is one line on
stderr and exit 2, never a hang, a traceback or an "internal error".

- R11: a FIFO given as a checkpoint (to `check --checkpoint` and to `compare`) blocked forever
  in open(); `compare` had no `--timeout`; and a `--timeout` that expired outside a run's
  steps (while a checkpoint loaded) ended in a raw traceback.
- R18: a symlink loop or a 300-character name as a checkpoint, /dev/zero called "no such file",
  and a console that cannot encode "→" or "—" (PYTHONIOENCODING=ascii) ended in a
  UnicodeEncodeError. A checkpoint whose file name is not UTF-8 was called unreadable.

The command line runs in this process (tests/helpers/cli_inprocess.py: what it prints, writes and
exits with is what a process of it would), from one module fixture. A real subprocess of the
console script, which imports torch afresh (seconds), where only a process will do: the
interpreter's own console encoding (PYTHONIOENCODING=ascii), and the console script itself
(`compare --help`, `--timeout` above its bound). Each case has a timeout, so a hang fails its
case instead of blocking the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from cli_inprocess import run_cli

DIAGKIT = Path(sys.executable).parent / "diagkit"
HANG_S = 120  # far above any case's own time: reaching it means diagkit hung
REPO = Path(__file__).resolve().parents[2]
STEP2, STEP5 = REPO / "data" / "meta_memory_step2.pt", REPO / "data" / "meta_memory_step5.pt"
CLEAN = ["check", "diagkit.demos:clean", "--steps", "1"]


class _Sleeps:
    """Unpickled (with --trust-checkpoint only), it sleeps: a checkpoint whose code hangs."""

    def __reduce__(self):
        return time.sleep, (HANG_S * 2,)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_input")
    os.mkfifo(d / "fifo.pt")
    (d / "loop_a.pt").symlink_to(d / "loop_b.pt")
    (d / "loop_b.pt").symlink_to(d / "loop_a.pt")
    (d / "loop_a.py").symlink_to(d / "loop_b.py")
    (d / "loop_b.py").symlink_to(d / "loop_a.py")
    torch.save({"x": _Sleeps()}, d / "sleeps.pt")
    torch.save({"w": torch.arange(4.0)}, d / "plain.pt")
    shutil.copy(d / "plain.pt", d / os.fsdecode(b"poids-\xe9t\xe9.pt"))  # Latin-1 bytes
    return d


LONG = "n" * 300 + ".pt"
NOT_UTF8 = os.fsdecode(b"poids-\xe9t\xe9.pt")
CASES = {
    # R11: a FIFO is refused before it is opened (it blocked forever)
    "check_fifo": [*CLEAN, "--checkpoint", "fifo.pt"],
    "compare_fifo": ["compare", "fifo.pt", "plain.pt"],
    "report_fifo": ["report", "diagkit.demos:clean", "--checkpoint", "fifo.pt", "--out", "rep"],
    # R11: --timeout in compare; its end and check's outside the steps are one line
    "compare_timeout": ["compare", "sleeps.pt", "plain.pt", "--trust-checkpoint",
                        "--timeout", "2"],
    # bound far above building the demo (in this process after WARM_UP, where all it
    # imports is imported: milliseconds, under load too), far below the unpickler's sleep: it
    # expires in the checkpoint's loading, outside the steps (the raw traceback)
    "check_timeout_loading": [*CLEAN, "--checkpoint", "sleeps.pt", "--trust-checkpoint",
                              "--timeout", "5"],
    "compare_timeout_0": ["compare", "plain.pt", "plain.pt", "--timeout", "0"],
    # R18: paths the system cannot look up, and a device
    "check_loop": [*CLEAN, "--checkpoint", "loop_a.pt"],
    "compare_loop": ["compare", "loop_a.pt", "plain.pt"],
    "check_long_name": [*CLEAN, "--checkpoint", LONG],
    "check_dev_zero": [*CLEAN, "--checkpoint", "/dev/zero"],  # stat only: never opened
    "compare_dev_zero": ["compare", "/dev/zero", "plain.pt"],
    "check_under_a_file": [*CLEAN, "--checkpoint", "plain.pt/inner.pt"],
    # R18: the other paths the command line reads: a target file, --from, notebooks DIR
    "target_loop": ["check", "loop_a.py:build", "--steps", "1"],
    "target_long_name": ["check", "n" * 300 + ".py:build", "--steps", "1"],
    "from_loop": ["report", "--from", "loop_a.pt", "--out", "rep_from"],
    "from_long_name": ["report", "--from", "n" * 300, "--out", "rep_from"],
    "notebooks_long_name": ["notebooks", "n" * 300],
    # a name that is not UTF-8 cannot go into a report's notebook (papermill wrote it empty)
    "not_utf8_report": ["compare", NOT_UTF8, "plain.pt", "--out", "rep_utf8"],
}
ASCII_CASES = {  # PYTHONIOENCODING=ascii: the output degrades to ASCII, nothing crashes
    "ascii_compare": ["compare", STEP2, STEP5, "--fail-on", "warning"],
    "ascii_check": ["check", "diagkit.demos:meta_memory", "--steps", "2"],
}


def _run_here(args, cwd) -> subprocess.CompletedProcess | str:
    """The command line in this process; or the line saying it hung (interrupted after HANG_S)
    or printed bytes that are not text: each case fails on its own, not the fixture."""
    try:
        return run_cli(*args, cwd=cwd, env={"DIAGKIT_DEBUG": None}, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        return f"diagkit {' '.join(map(str, args))} hung for {HANG_S} s"
    except UnicodeDecodeError as exc:  # its output is not text (a name's raw bytes)
        return f"diagkit {' '.join(map(str, args))} printed what is not UTF-8: {exc}"


def _console_env(env_extra=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DIAGKIT_DEBUG",
                                                           "PYTHONIOENCODING")}
    env.update(env_extra or {})
    return env


def _run_console_script(args, cwd, env) -> subprocess.CompletedProcess | str:
    """The real console script, in a subprocess: the finished process, or (killed after
    HANG_S) the line saying it hung."""
    try:
        return subprocess.run([str(DIAGKIT), *map(str, args)], cwd=cwd, env=env,
                              capture_output=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        return f"diagkit {' '.join(map(str, args))} hung for {HANG_S} s"


# Whole runs of check and compare, first: what they import the first time in this process
# (torch._dynamo, torch.distributed: seconds under load) is imported before a --timeout case
# starts its clock. A bound that expired in the middle of such an import would leave that
# module half-imported in this process (torch's operators registered, the module not), and
# the next command to import it would fail: a process of the command is ended by the timeout.
WARM_UP = ([*CLEAN, "--checkpoint", "plain.pt", "--trust-checkpoint"],  # loads, then exit 2
           CLEAN, ["compare", "plain.pt", "plain.pt"])


@pytest.fixture(scope="module")
def runs(work):
    """The ASCII console's cases in subprocesses, meanwhile the others here, one by one (the
    command line in this process needs the main thread)."""
    here = {**CASES, "not_utf8_name": ["compare", NOT_UTF8, "plain.pt"]}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run_console_script, args, work,
                                     _console_env({"PYTHONIOENCODING": "ascii"}))
                   for name, args in ASCII_CASES.items()}
        for args in WARM_UP:
            _run_here(args, work)
        done = {name: _run_here(args, work) for name, args in here.items()}
        return {**done, **{name: f.result() for name, f in futures.items()}}


def _finished(proc) -> subprocess.CompletedProcess:
    if isinstance(proc, str):
        pytest.fail(proc)
    return proc


def _text(data) -> str:
    """A subprocess's bytes, or the text of a run in this process."""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _one_line_error(proc) -> str:
    proc = _finished(proc)
    out, err = _text(proc.stdout), _text(proc.stderr)
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in err + out and "internal error" not in err, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagkit: error: "), err
    return lines[0]


@pytest.mark.parametrize("case, words", [
    ("check_fifo", ["fifo.pt is not a regular file (a FIFO)"]),
    ("compare_fifo", ["fifo.pt is not a regular file (a FIFO)"]),
    ("report_fifo", ["fifo.pt is not a regular file (a FIFO)"]),
    ("compare_timeout", ["timed out after 2 s (--timeout) while comparing the checkpoints"]),
    ("check_timeout_loading", ["timed out after 5 s (--timeout)"]),
    ("compare_timeout_0", ["--timeout", "must be a positive int", "got 0"]),
    ("check_loop", ["checkpoint loop_a.pt: symbolic link loop"]),
    ("compare_loop", ["checkpoint loop_a.pt: symbolic link loop"]),
    ("check_long_name", [f"checkpoint {LONG}: File name too long"]),
    ("check_dev_zero", ["/dev/zero is not a regular file (a character device)"]),
    ("compare_dev_zero", ["/dev/zero is not a regular file (a character device)"]),
    ("check_under_a_file", ["plain.pt/inner.pt: Not a directory"]),
    ("target_loop", ["target file loop_a.py: symbolic link loop"]),
    ("target_long_name", ["target file nnn", "File name too long"]),
    ("from_loop", ["--from loop_a.pt: symbolic link loop"]),
    ("from_long_name", ["--from nnn", "File name too long"]),
    ("notebooks_long_name", ["notebooks folder nnn", "File name too long"]),
    ("not_utf8_report", ["is not UTF-8 text", "rename it"]),
])
def test_bad_input_is_one_line_naming_it_and_exit_2(runs, case, words):
    line = _one_line_error(runs[case])
    for word in words:
        assert word in line, (word, line)
    assert "no such" not in line  # each of these exists, or is a timeout


def test_a_refused_report_writes_nothing(runs, work):
    for case in ("report_fifo", "from_loop", "not_utf8_report"):
        _one_line_error(runs[case])
    assert not [p.name for p in work.iterdir() if p.name.startswith(("rep", ".rep"))]


@pytest.mark.parametrize("case, code, ascii_words", [
    ("ascii_compare", 1, ["--", "->"]),  # "—" and "→" of the comparison's lines
    ("ascii_check", 1, ["->"]),  # the findings' "→"
])
def test_an_ascii_console_gets_ascii_output_not_a_crash(runs, case, code, ascii_words):
    proc = _finished(runs[case])
    err = proc.stderr.decode("ascii", "replace")
    assert proc.returncode == code, err[-2000:]
    assert "internal error" not in err and "Traceback" not in err
    out = proc.stdout.decode("ascii")  # strict: everything printed is ASCII
    assert "unchanged" in out or "orphan" in out
    for word in ascii_words:
        assert word in out


def test_a_checkpoint_name_that_is_not_utf8_is_read_and_printed(runs):
    """Its bytes reach Python as surrogates: torch's reader could not take the name, and
    printing it raised even on a UTF-8 console."""
    proc = _finished(runs["not_utf8_name"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout  # decoded strictly as UTF-8 (run_cli, as text=True would)
    assert "nothing_changed" in out and "poids-" in out


def test_compare_timeout_help_is_the_option_of_check():
    """`compare --timeout` takes check's option (core/options.py's check: seconds below 1e9),
    and `diagkit compare --help` lists it."""
    done = subprocess.run([str(DIAGKIT), "compare", "--help"], capture_output=True, text=True,
                          timeout=HANG_S)
    assert done.returncode == 0 and "--timeout SECONDS" in done.stdout
    huge = subprocess.run([str(DIAGKIT), "compare", "a.pt", "b.pt", "--timeout",
                           "99999999999999"], capture_output=True, text=True, timeout=HANG_S)
    assert huge.returncode == 2 and "below 1e9" in huge.stderr, huge.stderr
