"""Bad inputs and faults found by a corpus of them (issue 13, items 8-13): each ends in one
line on stderr and a clear exit code, never a traceback, and never loses completed work.

The command line runs in this process (tests/cli_inprocess.py: what it prints, writes and exits
with is what a process of it would); a real subprocess of the console script, which imports
torch afresh (a few seconds), where only a process will do: a signal sent to the command, a
timeout that ends the process, `--nproc` (torchrun). Every case uses few steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from cli_inprocess import run_cli

DIAGKIT = Path(sys.executable).parent / "diagkit"
TIMEOUT = 300


def run(*args, cwd) -> subprocess.CompletedProcess:
    """The command line, in this process."""
    return run_cli(*args, cwd=cwd, env={"DIAGKIT_DEBUG": None})


def run_console_script(*args, cwd, timeout=TIMEOUT) -> subprocess.CompletedProcess:
    """The real console script, in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k != "DIAGKIT_DEBUG"}
    return subprocess.run([str(DIAGKIT), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one line on stderr of a run that ended with `code`, no traceback anywhere."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines()
             if line.startswith("diagkit:") or not line.strip().startswith(("diagkit ", "\r"))]
    # the progress bar, and papermill's warning about `str | None` parameters (not ours)
    lines = [line for line in lines if line.strip() and "%|" not in line
             and not line.startswith("Passed unknown parameter")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ------------------------------------------------------------------ 8: code in a checkpoint
class _Evil:
    """Unpickling this runs `touch MARKER`: what a weights-only load must never do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    d = tmp_path_factory.mktemp("evil")
    torch.manual_seed(0)
    good = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).state_dict()
    torch.save({"model": good, "extra": _Evil(d / "MARKER")}, d / "evil.pt")
    torch.save({"model": good}, d / "good.pt")
    (d / "garbage.pt").write_bytes(b"\x80\x02garbage, not a checkpoint" * 8)
    (d / "targets.py").write_text(TARGETS)
    return d


def _needs_code(line: str, name: str = "evil.pt") -> None:
    assert name in line and "--trust-checkpoint" in line and "arbitrary" in line, line
    assert "Weights only load failed" not in line and "PyTorch 2.6" not in line, line


@pytest.mark.parametrize("args", [
    ["check", "targets.py:tiny", "--checkpoint", "evil.pt", "--steps", "1"],
    ["compare", "evil.pt", "good.pt"],
    ["compare", "good.pt", "evil.pt", "--json", "cmp.json"],
    ["check", "targets.py:tiny", "--checkpoint", "evil.pt", "--steps", "1", "--nproc", "2"],
], ids=["check", "compare_a", "compare_b", "nproc"])
def test_checkpoint_needing_code_names_trust_flag_and_never_runs(evil, args):
    nproc = "--nproc" in args  # torchrun's ranks: the real console script, in a subprocess
    line = one_error_line((run_console_script if nproc else run)(*args, cwd=evil))
    _needs_code(line)
    assert not (evil / "MARKER").exists()
    assert not (evil / "cmp.json").exists()


def test_garbage_and_needs_code_are_two_messages(evil):
    from diagkit.core.errors import DiagkitError
    from diagkit.measure.checkpoints.read import read_checkpoint
    from diagkit.run.workbook.compare import compare_checkpoints
    with pytest.raises(DiagkitError) as info:
        read_checkpoint(evil / "evil.pt")
    _needs_code(str(info.value))
    with pytest.raises(DiagkitError) as info:
        compare_checkpoints(evil / "good.pt", evil / "evil.pt")  # what the notebook runs
    _needs_code(str(info.value))
    with pytest.raises(DiagkitError) as info:
        read_checkpoint(evil / "garbage.pt")
    text = str(info.value)
    assert "not a readable PyTorch file" in text and "--trust-checkpoint" not in text, text
    assert "Weights only load failed" not in text, text
    assert "\n" not in text
    assert not (evil / "MARKER").exists()


TARGETS = textwrap.dedent('''
    import os, sys, threading, time
    import torch

    def _parts():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def tiny():
        model, opt = _parts()
        return {"model": model, "optimizer": opt, "batch_fn": lambda: torch.ones(2, 3),
                "loss_fn": lambda m, b: m(b).sum()}

    def three_steps():
        return {**tiny(), "steps": 3}

    def touches_marker():
        """Building it leaves BUILT: a run that was refused up front never gets here."""
        open("BUILT", "w").close()
        return tiny()

    def _hanging_batch(hang_on_call, swallow=False):
        calls = []

        def batch_fn():
            calls.append(1)
            while len(calls) == hang_on_call:
                try:
                    threading.Event().wait()  # nobody ever sets it
                except BaseException:
                    if not swallow:
                        raise
            return torch.ones(2, 3)
        return batch_fn

    def hangs_at_step_2():
        return {**tiny(), "batch_fn": _hanging_batch(3)}

    def stuck_for_good():
        """Swallows even diagkit's timeout: only ending the process ends it."""
        return {**tiny(), "batch_fn": _hanging_batch(2, swallow=True)}

    def hangs_building():
        threading.Event().wait()

    def exits_building():
        sys.exit(3)

    def exits_in_step_2():
        model, opt = _parts()

        def train_step(i):
            if i == 2:
                sys.exit(5)
            opt.zero_grad()
            loss = model(torch.ones(2, 3)).sum()
            loss.backward()
            opt.step()
            return loss
        return {"model": model, "optimizer": opt, "train_step": train_step}
''')


# ------------------------------------------------------------------ 9: SIGINT and SIGTERM
SLOW = textwrap.dedent('''
    import time
    import torch

    def slow():
        """Each batch says it started, then takes a minute: time to send a signal."""
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)

        def batch_fn():
            open("STARTED", "w").close()
            time.sleep(60)
            return torch.ones(2, 3)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "batch_fn": batch_fn, "loss_fn": lambda m, b: m(b).sum()}
''')


def _signal_once_underway(args, cwd: Path, signum, group: bool):
    """Run diagkit, wait until the target's first batch started, send `signum` (to the whole
    process group, as a terminal's Ctrl-C does, when `group`), return the finished process."""
    scratch_tmp = cwd / "tmpdir"
    scratch_tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "DIAGKIT_DEBUG"}
    env["TMPDIR"] = str(scratch_tmp)
    # A process started where SIGINT is ignored (pytest run as a shell's background job, as
    # `cmd &` or nohup start it) inherits SIG_IGN and would never see the Ctrl-C: while it
    # starts, this one catches SIGINT, so the command gets the default, as from a terminal.
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([str(DIAGKIT), *args], cwd=cwd, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, before)
    deadline = time.monotonic() + 240
    while not (cwd / "STARTED").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), scratch_tmp


@pytest.mark.parametrize("signum, code, group", [(signal.SIGINT, 130, True),
                                                 (signal.SIGTERM, 143, False)],
                         ids=["sigint", "sigterm"])
def test_signal_during_report_is_one_line_and_leaves_old_report(tmp_path, signum, code, group):
    (tmp_path / "slow.py").write_text(SLOW)
    old = tmp_path / "rep"
    old.mkdir()
    (old / "report.html").write_text("<p>an older complete report</p>")
    (old / "params.csv").write_text("name\nold\n")
    before = {p.name: p.read_text() for p in old.iterdir()}
    proc, tmpdir = _signal_once_underway(["report", "slow.py:slow", "--out", "rep",
                                          "--steps", "2"], tmp_path, signum, group)
    line = one_error_line(proc, code)
    assert ("interrupted" if signum == signal.SIGINT else "terminated") in line, line
    assert {p.name: p.read_text() for p in old.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["STARTED", "rep", "slow.py",
                                                          "tmpdir"]
    assert list(tmpdir.iterdir()) == [] or all(p.name.startswith("torchinductor")
                                               for p in tmpdir.iterdir())


def test_sigterm_during_check_writes_no_json(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    proc, tmpdir = _signal_once_underway(["check", "slow.py:slow", "--json", "out.json",
                                          "--steps", "2"], tmp_path, signal.SIGTERM, False)
    assert "terminated" in one_error_line(proc, 143)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["STARTED", "slow.py", "tmpdir"]


# ------------------------------------------------------------------ 10: --timeout for every run
@pytest.fixture()
def targets(tmp_path):
    (tmp_path / "targets.py").write_text(TARGETS)
    return tmp_path


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


# ------------------------------------------------------------------ 12: outputs and deep files
def test_output_under_a_regular_file_is_refused_before_running(targets):
    (targets / "a_file").write_text("x")
    for args in (["--json", "a_file/out.json"], ["--save", "a_file/saved"]):
        line = one_error_line(run("check", "targets.py:touches_marker", *args, cwd=targets))
        assert "a_file" in line and "not a folder" in line, line
    line = one_error_line(run("report", "targets.py:touches_marker", "--out", "a_file/rep",
                              cwd=targets))
    assert "not a folder" in line, line
    assert not (targets / "BUILT").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder anyway")
def test_read_only_output_folder_is_refused_before_running(targets):
    ro = targets / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for args in (["check", "--json", "ro/out.json"], ["report", "--out", "ro/rep"]):
            line = one_error_line(run(args[0], "targets.py:touches_marker", *args[1:],
                                      cwd=targets))
            assert "cannot write in" in line, line
    finally:
        ro.chmod(0o755)
    assert not (targets / "BUILT").exists()


def test_unwritable_folder_is_one_line_before_running(targets, monkeypatch, capsys):
    """What a read-only folder does for a user who is not root, here for root too: a folder
    where creating a file fails (the probe is a real write, so mkstemp is what fails)."""
    import tempfile

    from diagkit.run.cli import commands as cli
    real = tempfile.mkstemp
    blocked = str(targets / "blocked")
    (targets / "blocked").mkdir()

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(blocked):
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.chdir(targets)
    for argv in (["check", "targets.py:touches_marker", "--json", "blocked/out.json"],
                 ["report", "targets.py:touches_marker", "--out", "blocked/rep"],
                 ["compare", "a.pt", "b.pt", "--json", "blocked/out.json"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot write in" in err[0] and "Permission denied" in err[0]
        assert "internal error" not in err[0]
    assert not (targets / "BUILT").exists()
    from diagkit.core.errors import DiagkitError
    from diagkit.core.files import write_json_atomic
    with pytest.raises(DiagkitError, match="cannot write"):  # a folder that became read-only
        write_json_atomic(targets / "blocked" / "late.json", {"a": 1})


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    d = tmp_path_factory.mktemp("deep")
    state = {"0.weight": torch.zeros(4, 3)}
    for _ in range(1000):
        state = {"model": state}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)  # torch.save itself recurses
    try:
        torch.save(state, d / "deep.pt")
    finally:
        sys.setrecursionlimit(limit)
    (d / "targets.py").write_text(TARGETS)
    return d


@pytest.mark.parametrize("args", [["check", "targets.py:tiny", "--checkpoint", "deep.pt"],
                                  ["compare", "deep.pt", "deep.pt"]], ids=["check", "compare"])
def test_checkpoint_nested_1000_levels_is_one_line(deep, args):
    line = one_error_line(run(*args, cwd=deep))
    assert "deep.pt" in line and "levels deep" in line and "internal error" not in line, line


# ------------------------------------------------------------------ 13: the target's steps
def test_resolve_steps_one_rule():
    from diagkit.run.diagnose.pipeline import resolve_steps
    assert resolve_steps(2, 3) == 2      # an explicit --steps wins
    assert resolve_steps(None, 3) == 3   # then the target's own
    assert resolve_steps(None, None) == 5


def test_check_honours_the_targets_steps_and_steps_wins(targets):
    for extra, want in (([], 3), (["--steps", "2"], 2)):
        proc = run("check", "targets.py:three_steps", *extra, "--json", "out.json",
                   cwd=targets)
        assert proc.returncode == 0, proc.stderr
        assert json.loads((targets / "out.json").read_text())["meta"]["steps_observed"] == want


def test_report_honours_the_targets_steps(targets):
    proc = run("report", "targets.py:three_steps", "--out", "rep", cwd=targets)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads((targets / "rep" / "findings.json").read_text())
    assert findings["meta"]["steps_observed"] == 3
