"""The command line's faults corpus (tests/run/cli/test_faults*.py): the command in this
process or as the real console script, the one line a failed run leaves on stderr, and the
targets the cases run (a file `targets.py`, in the `targets` fixture's folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


@pytest.fixture()
def targets(tmp_path):
    """The test's folder, holding targets.py (TARGETS)."""
    (tmp_path / "targets.py").write_text(TARGETS)
    return tmp_path


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
