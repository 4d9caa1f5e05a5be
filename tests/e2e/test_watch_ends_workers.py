"""A watched loop that reads its batches through DataLoader workers, ended as a job scheduler
ends it: the signal goes to the whole process group, the workers die with the main process,
and `out` must still be saved, once, by the main process (docs/watch.md, "Diagnose your real
training run"; issue 36, R1).

- SIGTERM to the group (Slurm's scancel, its time limit, a pre-emption): the workers die while
  the watch saves, and the SIGCHLD handler torch's DataLoader installed raised its RuntimeError
  inside the save; nothing was saved. Also: a second SIGTERM during the save, a whole-run
  watch, and a user's own SIGTERM handler that lets the loop go on (torch's error then comes,
  as it would without diagkit).
- SIGHUP to the group (a terminal closed): the forked workers inherited diagkit's handler and
  each saved its own stale copy of the watch over the main process's `out`.
- SIGINT to the group (Ctrl-C in the terminal): the save at the interpreter's exit.

Each case is a real Python process in a session of its own, with two DataLoader workers,
signalled once it has trained a few steps; the processes run together, once for the module.
Every `Diagnosis.save` call appends the saving pid to a log, so a save by a worker shows.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import diagkit
from jobs import JOB_MARKER, carrying, kill_carrying

pytestmark = pytest.mark.xdist_group("watch_ends_workers")  # the processes start once

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
STARTED = 5  # optimizer steps taken before the child says it has started
WAIT_S = 240  # the longest any one child may take to start, or to end once signalled

SCRIPT = '''
import itertools, os, signal, sys, time
import torch, diagkit
from diagkit.core.result import Diagnosis

how, out, log = sys.argv[1], sys.argv[2], sys.argv[3]
real_save = Diagnosis.save

def logged_save(self, *args, **kwargs):  # who saves: a worker must not
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    if how == "sigterm-twice":  # the second SIGTERM, while the first one's save runs
        os.kill(os.getpid(), signal.SIGTERM)
    return real_save(self, *args, **kwargs)

Diagnosis.save = logged_save
if how == "sigterm-users-handler":
    def users_handler(signum, frame):
        print("the user's handler ran", flush=True)  # and the loop goes on
    signal.signal(signal.SIGTERM, users_handler)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)
steps = None if how == "sigterm-whole-run" else 10**6
w = diagkit.watch(model, opt, steps=steps, out=out)
step = 0
for epoch in itertools.count():
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if step == STARTED:
            print("started", flush=True)
        time.sleep(0.01)
'''.replace("STARTED", str(STARTED))

# case -> (the signal sent to the group, the exit status, meta["ended"])
CASES = {
    "sigterm": (signal.SIGTERM, -signal.SIGTERM, "SIGTERM"),
    "sigterm-whole-run": (signal.SIGTERM, -signal.SIGTERM, "SIGTERM"),
    "sigterm-twice": (signal.SIGTERM, -signal.SIGTERM, "SIGTERM"),
    "sigterm-users-handler": (signal.SIGTERM, 1, "SIGTERM"),
    "sighup": (signal.SIGHUP, -signal.SIGHUP, "SIGHUP"),
    "sigint": (signal.SIGINT, -signal.SIGINT, "exit"),
}


def _wait_started(proc: subprocess.Popen, deadline: float) -> str:
    """What the child printed until it said "started" (raw reads: nothing is left in a
    buffer for `communicate`), or until the deadline or its end."""
    fd, seen = proc.stdout.fileno(), b""
    while b"started\n" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:  # it ended first
                break
            seen += chunk
    return seen.decode(errors="replace")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every case, run at once: {case: (the process's result, its pid, its folder, the
    processes of its job still alive once it had ended)}."""
    root = tmp_path_factory.mktemp("watch_ends_workers")
    (root / "train.py").write_text(SCRIPT)
    procs, done = {}, {}
    try:
        for how in CASES:
            folder, tag = root / how, uuid.uuid4().hex  # the job's marker: its workers too
            folder.mkdir()
            procs[how] = (subprocess.Popen(
                [sys.executable, str(root / "train.py"), how, str(folder / "diag"),
                 str(folder / "saves.log")],
                cwd=folder, env={**ENV, JOB_MARKER: tag}, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True), folder, tag)
        for how, (p, folder, tag) in procs.items():
            before = _wait_started(p, time.monotonic() + WAIT_S)
            if "started" in before:
                os.killpg(p.pid, CASES[how][0])  # the whole job, as a scheduler does
            out, err = p.communicate(timeout=WAIT_S)
            left, gone_by = carrying(JOB_MARKER, tag), time.monotonic() + 30
            while left and time.monotonic() < gone_by:  # the workers end by themselves
                time.sleep(0.1)
                left = carrying(JOB_MARKER, tag)
            done[how] = (subprocess.CompletedProcess(
                p.args, p.returncode, before + out.decode(errors="replace"),
                err.decode(errors="replace")), p.pid, folder, left)
    finally:  # whatever failed, no process of these jobs outlives the module
        for p, _, tag in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
            p.stderr.close()
            kill_carrying(JOB_MARKER, tag)
    return done


@pytest.mark.parametrize("how", list(CASES))
def test_a_group_signal_with_dataloader_workers_saves_once_and_ends_as_without(runs, how):
    done, pid, folder, left = runs[how]
    _signum, code, ended = CASES[how]
    assert "started" in done.stdout, done.stderr[-3000:]
    assert done.returncode == code, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    said = [line for line in lines if line.startswith("diagkit")]  # diagkit's one-line reports
    assert not said, done.stderr[-3000:]  # "could not finish", "could not save": none
    assert not left, f"processes of the job left behind: {left}"
    diag = diagkit.load(folder / "diag")
    assert diag.failure is None and diag.meta["ended"] == ended
    assert diag.meta["steps_observed"] >= STARTED
    assert diag.steps["step"].nunique() >= STARTED
    assert set(diag.params["name"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    savers = set((folder / "saves.log").read_text().split())
    assert savers == {str(pid)}, f"saved by {savers}, the main process is {pid}"
    if how == "sigterm-users-handler":  # the loop went on: torch tells of its dead workers,
        # from the SIGCHLD held during the save and handed on after the user's handler
        assert "the user's handler ran" in done.stdout
        assert lines[-1].startswith("RuntimeError: DataLoader worker (pid"), lines[-1:]
    elif how == "sigint":
        assert lines[-1] == "KeyboardInterrupt", done.stderr[-3000:]
    else:
        assert not lines, done.stderr[-3000:]
