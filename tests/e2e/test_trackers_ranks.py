"""Only rank 0 sends to the trackers (docs/integrations.md, "Trackers"): a real torchrun DDP job
of 2 gloo ranks, each watching with `report_to="tensorboard"` (each would open a writer of its own
in `runs/diagkit/`, beside `out`). One event file, rank 0's, holds the orphan's series and table;
the other rank writes nothing, and the gathered diagnosis has both ranks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs import torchrun_program

pytest.importorskip("tensorboard")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}

PROGRAM = '''
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn
import diagkit

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model[0].parameters(), lr=0.1)  # the head is left out: an orphan
w = diagkit.watch(ddp, opt, steps=3, out="diag", report_to="tensorboard", live=False)
opened = w.trackers is not None
for _ in range(4):
    opt.zero_grad()
    ddp(torch.randn(3, 4)).sum().backward()
    opt.step()
w.stop()
if rank == 0:
    json.dump({"opened": opened, "pid": os.getpid(),
               "nproc": w.diagnosis.meta.get("nproc")}, open(sys.argv[1], "w"))
else:
    json.dump({"opened": opened}, open("rank1.json", "w"))
dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
dist.destroy_process_group()
'''


def test_only_rank_0_sends(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    rank0 = torchrun_program(tmp_path, PROGRAM, 2, ENV, timeout=240)
    rank1 = __import__("json").loads((tmp_path / "rank1.json").read_text())
    assert rank0["opened"] and not rank1["opened"] and rank0["nproc"] == 2
    (events,) = list((tmp_path / "runs" / "diagkit").glob("events.out.tfevents.*"))
    assert events.name.split(".")[-2] == str(rank0["pid"])  # written by rank 0's process
    board = EventAccumulator(str(events), size_guidance={"tensors": 0})
    board.Reload()
    assert [e.value for e in board.Scalars("diagkit/errors")][-1] >= 1
    assert "diagkit/findings/text_summary" in board.Tags()["tensors"]
