"""Faults of the command line (issue 13, item 9): SIGINT and SIGTERM sent to a running
`diagkit report` or `check` end it with one line on stderr and exit 130 or 143, never a
traceback, and leave an older report as it was and no partial output. A signal needs the real
console script, in a subprocess (tests/helpers/cli_faults.py has the corpus's runners)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from cli_faults import DIAGKIT, one_error_line


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
