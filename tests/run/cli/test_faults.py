"""Bad inputs and faults found by a corpus of them (issue 13, items 8-13): each ends in one
line on stderr and a clear exit code, never a traceback, and never loses completed work. This
file: code in a checkpoint (8), outputs that cannot be written and deep files (12), the
target's steps (13); signals (9) are test_faults_signals.py, timeouts and sys.exit (10, 11)
test_faults_timeouts.py.

The command line runs in this process (tests/helpers/cli_inprocess.py: what it prints, writes
and exits with is what a process of it would); a real subprocess of the console script, which
imports torch afresh (a few seconds), where only a process will do: `--nproc` (torchrun). Every
case uses few steps; the corpus's runners and targets are tests/helpers/cli_faults.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from cli_faults import TARGETS, one_error_line, run, run_console_script
from cli_faults import targets  # noqa: F401 (a fixture)


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
