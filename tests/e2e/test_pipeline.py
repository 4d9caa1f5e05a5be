"""A 2-stage pipeline (`torch.distributed.pipelining`, GPipe over 2 micro-batches) under a real
torchrun of 2 processes on gloo (docs/distributed.md, "Engines"). Each rank watches its own stage;
rank 0 joins the ranks' inventories by name, with the stage that holds each tensor. The planted
orphan (`head2`, on the last stage, trained by the loss, held by no optimizer) must be found and be
the only error; the clean twin is all `ok`; no tensor held by one stage is compared across ranks.
The one-shot watch and the whole-run watch, both in one job."""

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
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    import diagkit

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    class Stage(nn.Module):
        """One stage of a model split by hand, keeping the full model's names (as
        torchtitan's manual split does): stage 0 the first layer, stage 1 the rest."""

        def __init__(self, rank):
            super().__init__()
            torch.manual_seed(0)
            self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)
            self.head, self.head2 = nn.Linear(8, 4), nn.Linear(8, 4)
            for name in (("second", "head", "head2") if rank == 0 else ("first",)):
                delattr(self, name)

        def forward(self, x):
            if hasattr(self, "first"):
                return torch.relu(self.first(x))
            h = torch.relu(self.second(x))
            return self.head(h) + self.head2(h)

    def run(planted, steps, every):
        stage_module = Stage(rank)
        held = [p for n, p in stage_module.named_parameters()
                if not (planted and n.startswith("head2."))]
        opt = torch.optim.SGD(held, lr=0.05)
        stage = PipelineStage(stage_module, rank, 2, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, n_microbatches=2,
                                 loss_fn=lambda out, target: (out - target).pow(2).mean())
        w = diagkit.watch(stage_module, opt, steps=steps, every=every)
        g = torch.Generator().manual_seed(7)
        for _ in range(steps or 12):
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
            opt.zero_grad()
            stage_module.zero_grad(set_to_none=True)
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y)
            opt.step()
        if steps is None:
            w.stop()
        diag = w.diagnosis
        if rank != 0:
            return None
        return {"verdicts": {n: sorted(v) for n, v in diag.verdicts().items()},
                "stage": dict(zip(diag.params["name"], diag.params["stage"])),
                "errors": sorted(f.code + " " + f.module for f in diag.findings
                                 if f.severity == "error"),
                "ranks_of": {n: sorted(set(diag.steps[diag.steps["name"] == n]["rank"]))
                             for n in diag.params["name"]}}

    out = {}
    for planted in (False, True):
        out[f"once {planted}"] = run(planted, 3, 1)
        out[f"whole {planted}"] = run(planted, None, 2)
    if rank == 0:
        json.dump(out, open(sys.argv[1], "w"))
    dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
    dist.destroy_process_group()
''')

STAGES = {"first.weight": "0", "first.bias": "0", "second.weight": "1", "second.bias": "1",
          "head.weight": "1", "head.bias": "1", "head2.weight": "1", "head2.bias": "1"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return torchrun_program(tmp_path_factory.mktemp("pipeline"), PROGRAM, 2, ENV, timeout=300)


@pytest.mark.parametrize("how", ["once", "whole"])
def test_every_stage_is_in_the_table_with_its_stage(results, how):
    r = results[f"{how} False"]
    assert r["stage"] == STAGES
    # each tensor's steps come from the rank that holds it, and from no other
    assert r["ranks_of"] == {n: [int(s)] for n, s in STAGES.items()}
    assert r["verdicts"] == {n: ["ok"] for n in STAGES}, r["verdicts"]


@pytest.mark.parametrize("how", ["once", "whole"])
def test_the_orphan_on_the_last_stage_is_the_only_error(results, how):
    r = results[f"{how} True"]
    assert r["errors"] == ["orphan head2"], r["errors"]
    assert {n: v for n, v in r["verdicts"].items() if v != ["ok"]} == {
        "head2.weight": ["orphan"], "head2.bias": ["orphan"]}
