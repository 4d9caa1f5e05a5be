"""A whole-run watch under a real torchrun job of 2 ranks (docs/whole-run.md, "The whole run"): a
job that stops syncing (DDP dropped) at step 300 of 400 is `rank_divergent` from step 300, found
window by window on rank 0; and a rank whose wiring changes alone (its lr schedule reaches 0 on that
rank only) is one finding from that step."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import diagkit
from jobs import finished, run_job

pytestmark = pytest.mark.xdist_group("whole_run_ranks")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
SCRIPT = '''
import sys
import torch, torch.distributed as dist, diagkit
from torch.nn.parallel import DistributedDataParallel as DDP
mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
ddp = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
w = diagkit.watch(ddp, opt, steps=None, every=10, out=out)
g = torch.Generator().manual_seed(rank)  # each rank its own data
for step in range(400):
    if mode == "drop-ddp" and step == 300:
        ddp = model  # the re-wrap that forgot DDP: no gradient sync from here
    if mode == "one-rank-lr" and step == 200 and rank == 1:
        opt.param_groups[0]["lr"] = 0.0
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    ddp(x).pow(2).mean().backward()
    opt.step()
w.stop()
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole_run_ranks")
    (root / "train.py").write_text(SCRIPT)
    done = {}
    for mode in ("drop-ddp", "one-rank-lr"):
        done[mode] = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node=2", str(root / "train.py"), mode,
                              str(root / mode)], cwd=root, env=ENV, timeout=240)
        assert finished(done[mode].returncode, done[mode].stdout + done[mode].stderr), \
            done[mode].stderr[-4000:]
    return root


def test_a_job_that_stops_syncing_is_rank_divergent_from_that_step(jobs):
    diag = diagkit.load(jobs / "drop-ddp")
    divergent = [f for f in diag.findings if f.code == "rank_divergent"]
    assert divergent and min(f.since for f in divergent) == 300
    assert diag.meta["nproc"] == 2 and set(diag.steps["rank"]) == {0, 1}
    assert not [f for f in diag.findings if f.code == "ranks_wired_differently"]


def test_a_rank_wired_differently_is_one_finding_from_that_step(jobs):
    diag = diagkit.load(jobs / "one-rank-lr")
    (wired,) = [f for f in diag.findings if f.code == "ranks_wired_differently"]
    assert wired.since == 201 and "rank 1's wiring differs from rank 0's" in wired.message
    assert any(f.code == "rank_divergent" for f in diag.findings)
