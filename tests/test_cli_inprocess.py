"""tests/helpers/cli_inprocess.py's `run_cli` answers as the console script in a subprocess
does, catches every kind of output a process would, and puts the process's state back after
each call."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from cli_inprocess import DIAGKIT, run_cli


@pytest.mark.parametrize("args", [["--version"], ["--help"], [], ["check", "nope.py:build"],
                                  ["check", "x:y", "--steps", "0"], ["frobnicate"]],
                         ids=["version", "help", "no_command", "no_file", "bad_steps",
                              "bad_command"])
def test_it_answers_as_the_console_script(args, tmp_path):
    """Cases the console script ends before it imports torch: the subprocess costs little."""
    real = subprocess.run([DIAGKIT, *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    here = run_cli(*args, cwd=tmp_path)
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout,
                                                           real.stderr)


HELPERS = "WORD = {word!r}\n"
TARGET = textwrap.dedent('''
    import logging, os, signal, sys, warnings
    import torch
    import helpers

    def build():
        print("printed", helpers.WORD)
        warnings.warn("a warning of the target's")
        logging.getLogger("diagkit").warning("a logged line")
        os.write(2, b"written to fd 2\\n")
        os.environ["SET_BY_TARGET"] = "1"
        os.chdir(os.path.dirname(os.path.abspath(__file__)) + "/..")
        sys.argv.append("--extra")
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        model = torch.nn.Linear(3, 1)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "batch_fn": lambda: torch.ones(2, 3), "loss_fn": lambda m, b: m(b).sum(),
                "steps": 1}
''')


def test_it_catches_every_output_and_puts_the_process_back(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSET_FOR_THE_CALL", "x")
    before = (os.getcwd(), dict(os.environ), sys.argv, list(sys.argv), sys.path[:],
              signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM),
              list(logging.getLogger().handlers), list(warnings.filters))
    targets = lambda: {m for m in sys.modules if m.startswith("diagkit_target_")}  # noqa: E731
    targets_before = targets()
    helpers_before = sys.modules.get("helpers")  # another test of this worker may have left one
    for word in ("first", "second"):  # a sibling module of the same name in another folder
        folder = tmp_path / word
        folder.mkdir()
        (folder / "helpers.py").write_text(HELPERS.format(word=word))
        (folder / "t.py").write_text(TARGET)
        run = run_cli("check", "t.py:build", cwd=folder, env={"UNSET_FOR_THE_CALL": None})
        assert run.returncode == 0, run.stderr
        assert f"printed {word}" in run.stdout
        assert "UserWarning: a warning of the target's" in run.stderr
        assert "a logged line" in run.stderr and "written to fd 2" in run.stderr
        after = (os.getcwd(), dict(os.environ), sys.argv, list(sys.argv), sys.path[:],
                 signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM),
                 list(logging.getLogger().handlers), list(warnings.filters))
        assert after == before
        assert sys.modules.get("helpers") is helpers_before  # the call's own is gone
        # the call's own target module is gone (other tests of this worker may have left theirs)
        assert targets() == targets_before



def test_a_call_that_outlives_its_timeout_is_interrupted_and_raises(tmp_path):
    """The safety net of subprocess.run's `timeout`: the command is interrupted as by Ctrl-C
    (its one line is kept), and nothing reaches pytest afterwards."""
    (tmp_path / "t.py").write_text("import time\ndef build():\n    time.sleep(60)\n")
    handler = signal.getsignal(signal.SIGINT)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_cli("check", "t.py:build", cwd=tmp_path, timeout=3)
    assert time.monotonic() - started < 30
    assert "interrupted (SIGINT)" in info.value.stderr
    assert signal.getsignal(signal.SIGINT) is handler
    time.sleep(0.5)  # nothing pending raises here
