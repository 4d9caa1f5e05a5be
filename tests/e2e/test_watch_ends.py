"""Every way a watched run can end before `steps` writes `out` with the steps observed so far
(docs/watch.md, "Diagnose your real training run"): the loop ends, an exception, Ctrl-C, SIGTERM
(alone, or handed on to the user's own handler), SIGHUP (a terminal closed), `sys.exit`; and a save that fails is one line
on stderr, with the exit code the run would have had anyway.

Each case is a real Python process running one shared script with a model of 800 tensors:
large enough that pyarrow would convert its steps table on a thread pool, which the
interpreter's exit has already shut down (with 4 tensors the exit save worked all along).
The processes start together, once for the module, forked from one process that has imported
torch and diagkit and built an optimizer once (most of each process was that; the script's own
`import torch, diagkit` then finds them imported). Each child runs the script as `__main__`
and ends as the script's own process would: its exceptions, signals and `sys.exit` reach the
interpreter's top level and its exit (atexit, threading's shutdown) is its own; pandas and
pyarrow are first imported in the child, by the save, as in a process of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import diagkit

pytestmark = pytest.mark.xdist_group("watch_ends")  # one worker starts the processes once

ROOT = Path(__file__).resolve().parents[2]
# Not OMP_NUM_THREADS=1: pyarrow sizes its conversion pool by it, and with one thread it never
# starts the pool that the interpreter's exit has shut down; 2 starts it on any machine.
ENV = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT / "src")}
OBSERVED = 3  # steps completed before the run ends, in the middle of the next one

SCRIPT = '''
import os, signal, sys
import torch, diagkit

how, out = sys.argv[1], sys.argv[2]
if how == "sigterm-chained":
    def users_handler(signum, frame):
        print("the user's handler ran", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, users_handler)
torch.manual_seed(0)
layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(400))  # 800 tensors
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
w = diagkit.watch(layers, opt, steps=100, out=out)
if how == "save-fails":
    open(out, "w").close()  # a file where the folder goes: the save at exit must fail
x = torch.ones(2, 8)
for step in range(10):
    opt.zero_grad()
    sum(layer(x).sum() for layer in layers).backward()
    if step == OBSERVED:  # in the middle of a step: it is dropped, the earlier ones kept
        if how == "exception":
            raise ValueError("the user's own error")
        if how == "ctrl-c":
            os.kill(os.getpid(), signal.SIGINT)
        if how.startswith("sigterm"):
            os.kill(os.getpid(), signal.SIGTERM)
        if how == "sighup":
            os.kill(os.getpid(), signal.SIGHUP)
        if how == "sys.exit":
            sys.exit(5)
        if how in ("loop-ends", "save-fails"):
            break
    opt.step()
print("not reached" if how != "loop-ends" and how != "save-fails" else "trained", flush=True)
'''.replace("OBSERVED", str(OBSERVED))

# how the run ends -> (its exit status, the last line of stderr; "" when stderr is empty)
CASES = {
    "loop-ends": (0, ""),
    "exception": (1, "ValueError: the user's own error"),
    "ctrl-c": (-signal.SIGINT, "KeyboardInterrupt"),  # Python ends by SIGINT itself: 130
    "sigterm": (-signal.SIGTERM, ""),                  # killed by SIGTERM, as without diagkit
    "sigterm-chained": (3, ""),                        # the user's handler ran, after the save
    "sighup": (-signal.SIGHUP, ""),                    # a terminal closed: as SIGTERM
    "sys.exit": (5, ""),
}


# Forks one child per case; each runs train.py as `__main__` with its stdout and stderr in
# files of its own, and falls off the end of this script (or leaves it by its exception) as
# train.py's own process would. The parent prints {how: exit status, -N for signal N}.
FORKS = '''
import json, os, runpy, sys
import torch, diagkit  # what each case imports first, once
torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # the optimizer's lazy imports
root, cases = sys.argv[1], sys.argv[2:]
sys.stdout.flush()
sys.stderr.flush()
children = {}
for how in cases:
    pid = os.fork()
    if pid == 0:
        os.chdir(os.path.join(root, how))
        for fd, suffix in ((1, "out"), (2, "err")):
            f = os.open(os.path.join(root, f"{how}.{suffix}"), os.O_WRONLY | os.O_CREAT)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = [os.path.join(root, "train.py"), how, os.path.join(root, how, "diag")]
        break
    children[pid] = how
else:
    codes = {}
    while children:
        pid, status = os.wait()
        codes[children.pop(pid)] = os.waitstatus_to_exitcode(status)
    print(json.dumps(codes))
    sys.exit(0)
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case of CASES and "save-fails", run at once: {how: (the process, its folder)}."""
    root = tmp_path_factory.mktemp("watch_ends")
    (root / "train.py").write_text(SCRIPT)
    (root / "forks.py").write_text(FORKS)
    cases = [*CASES, "save-fails"]
    for how in cases:
        (root / how).mkdir()
    parent = subprocess.Popen([sys.executable, str(root / "forks.py"), str(root), *cases],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # its children: in its process group
    try:
        out, err = parent.communicate(timeout=300)
        assert parent.returncode == 0, err[-3000:]
    finally:  # none left behind, whatever failed
        if parent.returncode != 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
    codes = json.loads(out.strip().splitlines()[-1])
    return {how: (subprocess.CompletedProcess(
        [sys.executable, str(root / "train.py"), how, str(root / how / "diag")], codes[how],
        (root / f"{how}.out").read_text(), (root / f"{how}.err").read_text()), root / how)
        for how in cases}


@pytest.mark.parametrize("how", list(CASES))
def test_every_way_a_run_ends_saves_the_steps_observed(runs, how):
    done, folder = runs[how]
    code, last_line = CASES[how]
    assert done.returncode == code, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert (lines[-1] if lines else "") == last_line, done.stderr[-3000:]
    # Nothing from diagkit on stderr: only the user's own traceback, if any.
    assert "diagkit" not in done.stderr and "Exception ignored" not in done.stderr, \
        done.stderr[-3000:]
    assert "not reached" not in done.stdout
    assert ("the user's handler ran" in done.stdout) == (how == "sigterm-chained")
    diag = diagkit.load(folder / "diag")
    assert len(diag.params) == 800
    assert diag.meta["steps_observed"] == OBSERVED
    assert sorted(diag.steps["step"].unique()) == list(range(OBSERVED))
    assert diag.meta["ended"] == ("SIGTERM" if how.startswith("sigterm") else
                                  "SIGHUP" if how == "sighup" else "exit")
    assert set().union(*diag.verdicts().values()) == {"ok"}


def test_a_save_that_fails_at_exit_is_one_line_and_keeps_the_exit_code(runs):
    done, folder = runs["save-fails"]
    assert done.returncode == 0 and "trained" in done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"diagkit: could not save the diagnosis to {folder / 'diag'}: ")
    assert "is not a folder" in lines[0] and "the result is lost" in lines[0]
    assert (folder / "diag").is_file()  # what was there is left as it was
    assert [p.name for p in folder.iterdir()] == ["diag"]  # no scratch folder left behind
