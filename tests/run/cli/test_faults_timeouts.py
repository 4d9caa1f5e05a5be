"""Faults of the command line (issue 13, items 10 and 11): `--timeout` bounds every run (a
hung batch, a main thread that never comes back, building, importing, a report, each demo),
and a target's sys.exit is one line, exit 2, or a failed step with the earlier steps kept.

The command line runs in this process (tests/helpers/cli_inprocess.py: what it prints, writes
and exits with is what a process of it would); a real subprocess of the console script, which
imports torch afresh (a few seconds), where only a process will do: a timeout that ends the
process, `--nproc` (torchrun). Every case uses few steps; the corpus's runners and targets are
tests/helpers/cli_faults.py.
"""

from __future__ import annotations

import json
import time
from functools import partial

import pytest

from cli_faults import one_error_line, run, run_console_script
from cli_faults import targets  # noqa: F401 (a fixture)


# ------------------------------------------------------------------ 10: --timeout for every run
# The bounds below leave room for building the setup on a loaded CI machine: the clock
# starts when the target begins to import, and the hangs themselves last far longer.
def test_timeout_in_a_hung_batch_keeps_the_completed_steps(targets):
    proc = run("check", "targets.py:hangs_at_step_2", "--timeout", "15", "--steps", "5",
               "--json", "out.json", cwd=targets)
    line = one_error_line(proc)
    assert "timed out after 15 s" in line and "step 2" in line and "batch" in line, line
    payload = json.loads((targets / "out.json").read_text())
    assert payload["meta"]["steps_observed"] == 2 and payload["meta"]["timed_out"] is True
    assert payload["failure"]["step"] == 2 and "batch" in payload["failure"]["error"]


def test_timeout_ends_a_run_whose_main_thread_never_comes_back(targets):
    # diagkit ends the process: a real one
    proc = run_console_script("check", "targets.py:stuck_for_good", "--timeout", "10",
                              "--steps", "5", "--json", "out.json", cwd=targets, timeout=150)
    line = one_error_line(proc)
    assert "timed out after 10 s" in line and "step 1" in line and "ended it" in line, line
    payload = json.loads((targets / "out.json").read_text())  # complete JSON, atomically
    assert payload["meta"]["steps_observed"] == 1 and payload["failure"]["step"] == 1
    assert [p.name for p in targets.iterdir() if p.name.startswith(".")] == []


def test_timeout_while_building(targets):
    line = one_error_line(run("check", "targets.py:hangs_building", "--timeout", "3",
                              cwd=targets))
    assert "timed out after 3 s" in line and "while building the setup" in line, line


def test_timeout_bounds_a_report_run(targets):
    proc = run("report", "targets.py:hangs_at_step_2", "--timeout", "20", "--steps", "5",
               "--out", "rep", cwd=targets)
    line = one_error_line(proc)
    assert "timed out after 20 s" in line and "step 2" in line, line
    findings = json.loads((targets / "rep" / "findings.json").read_text())
    assert findings["meta"]["steps_observed"] == 2 and findings["failure"]["step"] == 2
    assert (targets / "rep" / "report.html").is_file()



# A module that never finishes importing (a lock, a server that never answers): `--timeout`
# bounds the import diagkit makes first to check the target, in one process and under
# --nproc, as it bounds the run (issue 21).
HANGS_AT_IMPORT = "import threading\nthreading.Event().wait()\ndef build():\n    pass\n"


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_timeout_bounds_a_target_that_hangs_at_import(tmp_path, nproc):
    (tmp_path / "stuck.py").write_text(HANGS_AT_IMPORT)
    started = time.monotonic()
    how = run if nproc == "1" else partial(run_console_script, timeout=120)  # torchrun
    line = one_error_line(how("check", "stuck.py:build", "--timeout", "4", "--nproc", nproc,
                              cwd=tmp_path))
    assert line == "diagkit: error: timed out after 4 s (--timeout) while importing the target"
    assert time.monotonic() - started < 60


def test_timeout_bounds_each_demo_run(tmp_path, monkeypatch):
    """`diagkit demo` takes --timeout (default 120 s): a demo run of a million steps ends
    with the one line of a timed-out run, and its report shows the steps before it."""
    # Each demo computes until the bound: 5 s each, not 15 (its kernel imports torch and
    # builds the demo inside the bound: at load 8, 2 or 3 steps were left before it), and
    # fewer steps to judge and plot. Each demo is a notebook kernel of its own (imports,
    # the run, the plots: some 8 CPU s), so two of the three demos here: each of several
    # sections is bounded, and the report is the demo's, one folder per section (the three
    # are run whole by tests/run/workbook/test_report.py and tests/e2e/test_wheel.py).
    monkeypatch.setattr("diagkit.demos.DEMOS", ("meta_memory", "clean"))
    proc = run("demo", "--steps", "1000000", "--timeout", "5", "--out", "rep", cwd=tmp_path)
    line = one_error_line(proc)
    assert line.startswith("diagkit: error: timed out after 5 s (--timeout) in step "), line
    assert (tmp_path / "rep" / "report.html").is_file()
    for demo in ("meta_memory", "clean"):  # each run was bounded, and kept its steps
        findings = json.loads((tmp_path / "rep" / demo / "findings.json").read_text())
        assert findings["meta"]["timed_out"] is True and findings["meta"]["steps_observed"] >= 1


# ------------------------------------------------------------------ 11: sys.exit in a target
def test_sys_exit_at_import_is_exit_2(tmp_path):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(4)\ndef build():\n    pass\n")
    line = one_error_line(run("check", "quits.py:build", cwd=tmp_path))
    assert "sys.exit(4)" in line and "import" in line, line


def test_sys_exit_while_building_is_exit_2(targets):
    line = one_error_line(run("check", "targets.py:exits_building", cwd=targets))
    assert "called sys.exit(3) while building the setup" in line, line


def test_sys_exit_in_a_step_is_a_failed_step_with_earlier_steps_kept(targets):
    proc = run("check", "targets.py:exits_in_step_2", "--steps", "4", "--json", "out.json",
               cwd=targets)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # step_failed is an error
    assert "Traceback" not in proc.stderr
    payload = json.loads((targets / "out.json").read_text())
    assert payload["meta"]["steps_observed"] == 2
    assert payload["failure"]["step"] == 2 and "sys.exit(5)" in payload["failure"]["error"]
    assert "step_failed" in {f["code"] for f in payload["findings"]}
