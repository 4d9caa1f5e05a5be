"""Rank checksums of large tensors under a real torchrun of 2 processes (gloo).

A large CPU tensor's checksum is taken inside the exact probe's snapshot pass, where its
chunks are in cache (`measure.change.snapshot_pass`, docs/cost.md); a small one's apart
(`kernels.checksum`). Ranks compare them to see values drift apart (`rank_divergent`), so the
pass must give the same number on every rank for the same values, and a different one as soon
as the values differ, however little. The job: a `Linear(300, 300)` under DDP (90,300
elements, kept identical by DDP's averaging) beside `scale`, 70,000 elements trained outside
DDP on each rank's own data (its copies drift apart from the first step).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from jobs import torchrun_program

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}

PROGRAM = textwrap.dedent('''
    import json, sys
    import torch, torch.distributed as dist
    from torch import nn
    import diagkit
    from diagkit.measure.change import snapshot_pass

    dist.init_process_group("gloo")
    taken = []  # the tensors whose checksum the pass took, per call
    plain = snapshot_pass.change_and_refresh

    def counted(before, now, before_had_nan=False, checksum=False):
        got = plain(before, now, before_had_nan, checksum)
        taken.append(got.checksum is not None)
        return got

    snapshot_pass.change_and_refresh = counted
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(300, 300))
    scale = nn.Parameter(torch.ones(70_000))
    opt = torch.optim.SGD([{"params": ddp.parameters()}, {"params": [scale]}], lr=0.01)
    w = diagkit.watch(ddp, opt, steps=3)
    gen = torch.Generator().manual_seed(10 + dist.get_rank())
    for _ in range(3):
        opt.zero_grad()
        x, noise = torch.randn(4, 300, generator=gen), torch.randn(70_000, generator=gen)
        (ddp(x).square().mean() + (scale * noise).sum() * 1e-3).backward()
        opt.step()
    d = w.diagnosis
    if dist.get_rank() == 0:
        s = d.steps
        json.dump({"verdicts": {k: sorted(v) for k, v in d.verdicts().items()},
                   "agree": {n: bool((g.groupby("step")["checksum"].nunique() == 1).all())
                             for n, g in s.groupby("name")},
                   "ranks": sorted(set(s["rank"])), "nan": bool(s["checksum"].isna().any()),
                   "taken": sum(taken)}, open(sys.argv[1], "w"))
    dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return torchrun_program(tmp_path_factory.mktemp("rank_checksums"), PROGRAM, 2, ENV,
                            timeout=300)


def test_large_tensors_take_their_checksums_in_the_pass(job):
    # rank 0, 3 observed steps: the weight (90,300 elements) and `scale` (70,000); the bias
    # (300) is taken apart
    assert job["ranks"] == [0, 1] and job["taken"] >= 6 and not job["nan"]


def test_ranks_agree_on_what_ddp_keeps_equal_and_see_what_drifts(job):
    assert job["agree"]["weight"] and job["agree"]["bias"]
    assert not job["agree"][next(n for n in job["agree"] if n not in ("weight", "bias"))]
    assert "rank_divergent" not in job["verdicts"]["weight"]
    drifting = [n for n, v in job["verdicts"].items() if "rank_divergent" in v]
    assert len(drifting) == 1 and drifting[0] not in ("weight", "bias")
