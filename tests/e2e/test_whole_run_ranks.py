"""A whole-run watch under a real torchrun job of 2 ranks (docs/whole-run.md, "The whole run"): a
job that stops syncing (DDP dropped) at step 300 of 400 is `rank_divergent` from step 300, found
window by window on rank 0; and a rank whose wiring changes alone (its lr schedule reaches 0 on that
rank only) is one finding from that step. Each rank's observed steps are its own count, in the
diagnosis, the saved folder and the per-rank view (issue 36, R17: every rank but 0 read 0)."""

from __future__ import annotations

import json
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
import json, sys
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
seen = {"observed": w.clock.observed}  # what this rank's own clock observed
if rank == 0:
    from diagkit.present.ranks import rank_view
    seen.update(ranks=w.diagnosis.meta["ranks"], view=rank_view(w.diagnosis))
json.dump(seen, open(f"{out}.rank{rank}.json", "w"))
dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
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


@pytest.mark.parametrize("mode", ["drop-ddp", "one-rank-lr"])
def test_each_rank_reports_the_steps_it_observed(jobs, mode):
    """Rank 0 takes the other ranks' steps window by window (and frees them): the count of
    each rank is what it published, not what was left at the end. With its lr reaching 0 alone,
    rank 1 observes a burst more than rank 0 (the change it saw)."""
    own = [json.loads((jobs / f"{mode}.rank{r}.json").read_text())["observed"] for r in (0, 1)]
    assert own[0] > 40 and (own[1] > own[0] if mode == "one-rank-lr" else own[1] == own[0])
    seen = json.loads((jobs / f"{mode}.rank0.json").read_text())
    saved = diagkit.load(jobs / mode)
    for ranks in (seen["ranks"], saved.meta["ranks"]):
        assert [ranks[r]["observed_steps"] for r in ("0", "1")] == own
    assert saved.meta["steps_observed"] == own[0]
    view = (f"2 ranks (0–1), {own[0]} steps observed" if own[0] == own[1] else
            f"2 ranks (0–1), steps observed: rank 0: {own[0]}, rank 1: {own[1]}")
    assert view in seen["view"]
