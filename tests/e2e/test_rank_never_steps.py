"""A rank that never calls `optimizer.step()`, in a real torchrun job of 2 ranks (gloo) under
DDP (docs/watch.md, "Inside your torchrun job"; issue 36, R16): rank 1 runs forward and
backward but its step is guarded by the rank. Rank 0 observes its steps and gathers; rank 1,
still training, waits in its next backward's gradient reduction for rank 0. Rank 0 must not
wait the watch's whole timeout for it, nor call it dead: the diagnosis says rank 1 ran its
backward passes but never stepped. The same cases in one process: tests/run/diagnose/test_gather_ranks.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import diagkit
from diagkit.judge.rules_ranks import NEVER_STEPPED
from jobs import finished, run_job

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
TIMEOUT = 60  # the watch's: what rank 0 would have waited for rank 1
SCRIPT = '''
import json, sys, time
import torch, torch.distributed as dist, diagkit
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
ddp = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
w = diagkit.watch(ddp, opt, steps=4, out="diag", timeout=%d)
started = time.monotonic()
for step in range(8):
    opt.zero_grad()
    ddp(torch.randn(8, 4)).pow(2).mean().backward()
    if rank != 1:  # the bug: rank 1 never steps
        opt.step()
seconds = time.monotonic() - started
w.stop()
if rank == 0:
    d = w.diagnosis
    json.dump({"seconds": seconds, "failure": d.failure and d.failure.error,
               "ranks": d.meta["ranks"], "findings": [f.to_dict() for f in d.findings]},
              open("rank0.json", "w"))
dist.destroy_process_group()
''' % TIMEOUT


def test_a_rank_that_never_steps_is_named_alive_and_not_waited_for(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    done = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", "--max-restarts=0", "train.py"],
                   cwd=tmp_path, env=ENV, timeout=4 * TIMEOUT)
    assert finished(done.returncode, done.stdout + done.stderr), done.stderr[-4000:]
    seen = json.loads((tmp_path / "rank0.json").read_text())
    # rank 0's loop includes the gathering at its 4th step: far from the watch's timeout
    assert seen["seconds"] < TIMEOUT / 2, seen["seconds"]
    assert seen["failure"] is None  # not "died or hangs"
    one = seen["ranks"]["1"]
    # Rank 1 ran at least the 4 backward passes rank 0 stepped after, and under DDP stopped
    # in the next one's reduction (waiting for rank 0): 4 or, counted at that backward's end
    # before DDP waits, 5.
    assert one["state"] == "running" and one["backward_passes"] in (4, 5), one
    assert (one["observed_steps"], one["optimizer_steps"]) == (0, 0)
    assert seen["ranks"]["0"] == {"state": "done", "observed_steps": 4, "optimizer_steps": 4}
    (finding,) = [f for f in seen["findings"] if f["code"] == NEVER_STEPPED]
    assert finding["severity"] == "error" and finding["message"].startswith(
        f"rank 1 ran {one['backward_passes']} backward passes but never called "
        "optimizer.step() while watched (rank 0 stepped 4 times)")
    assert "Rank 1 was alive" in finding["message"]
    # what rank 0 saved says the same
    saved = diagkit.load(tmp_path / "diag")
    assert saved.failure is None and saved.meta["ranks"]["1"] == one
    assert [f.message for f in saved.findings if f.code == NEVER_STEPPED] == [finding["message"]]
