"""2-D meshes under a real torchrun of 4 processes on gloo (docs/distributed.md, "Engines"): FSDP2
over tensor parallelism (a (dp, tp) mesh; the TP-sharded weights get `_StridedShard` placements) and
HSDP (a (replicate, shard) mesh). Each with a planted orphan (`head2`, trained by the loss, held by
no optimizer) and its clean twin. The measured gradient norms must be those of the whole tensors,
which the program computes itself with `full_tensor()`. One job runs all four watches, to keep the
test short."""

from __future__ import annotations

import math
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
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    import diagkit

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)
            self.head, self.head2 = nn.Linear(8, 4), nn.Linear(8, 4)

        def forward(self, x):
            h = self.down(torch.relu(self.up(x)))
            return self.head(h).pow(2).mean() + self.head2(h).pow(2).mean()

    def build(layout):
        torch.manual_seed(0)
        model = Net()
        if layout == "fsdp_tp":
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(),
                                                   "down": RowwiseParallel()})
            for layer in (model.up, model.down, model.head, model.head2):
                fully_shard(layer, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            data_rank = mesh["dp"].get_local_rank()
        else:  # HSDP: replicated over the first dimension, sharded over the second
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
            fully_shard(model, mesh=mesh)
            data_rank = dist.get_rank()
        return model, data_rank

    out = {}
    for layout in ("fsdp_tp", "hsdp"):
        for planted in (False, True):
            model, data_rank = build(layout)
            held = [p for n, p in model.named_parameters()
                    if not (planted and n.startswith("head2."))]
            opt = torch.optim.Adam(held, lr=1e-2)
            w = diagkit.watch(model, opt, steps=3)
            g = torch.Generator().manual_seed(100 + data_rank)
            for step in range(3):
                model.zero_grad(set_to_none=True)
                model(torch.randn(4, 8, generator=g)).backward()
                opt.step()
            oracle = {n: float(p.grad.full_tensor().norm()) for n, p in model.named_parameters()}
            placements = {n: repr(p.placements) for n, p in model.named_parameters()}
            if dist.get_rank() == 0:
                diag = w.diagnosis
                last = diag.steps[diag.steps["step"] == 2]
                measured = {n: float(last[last["name"] == n]["grad_norm"].iloc[0])
                            for n in oracle}
                errors = sorted({f.code + " " + f.module for f in diag.findings
                                 if f.severity == "error"})
                out[f"{layout} {planted}"] = {
                    "verdicts": {n: sorted(v) for n, v in diag.verdicts().items()},
                    "errors": errors, "oracle": oracle, "measured": measured,
                    "placements": placements,
                    "shapes": dict(zip(diag.params["name"], map(list, diag.params["shape"])))}
    if dist.get_rank() == 0:
        json.dump(out, open(sys.argv[1], "w"))
    dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
    dist.destroy_process_group()
''')

NAMES = ["up.weight", "up.bias", "down.weight", "down.bias", "head.weight", "head.bias",
         "head2.weight", "head2.bias"]
SHAPES = {"up.weight": [16, 8], "up.bias": [16], "down.weight": [8, 16], "down.bias": [8],
          "head.weight": [4, 8], "head.bias": [4], "head2.weight": [4, 8], "head2.bias": [4]}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return torchrun_program(tmp_path_factory.mktemp("mesh2d"), PROGRAM, 4, ENV, timeout=400)


@pytest.mark.parametrize("layout", ["fsdp_tp", "hsdp"])
def test_the_clean_twin_is_all_ok_and_exact(results, layout):
    r = results[f"{layout} False"]
    assert r["verdicts"] == {n: ["ok"] for n in NAMES}, r["verdicts"]
    assert r["shapes"] == SHAPES
    for n in NAMES:
        assert math.isclose(r["measured"][n], r["oracle"][n], rel_tol=1e-5), n
    if layout == "fsdp_tp":  # the placement this test is about
        assert "_StridedShard" in r["placements"]["up.weight"], r["placements"]
    else:
        assert r["placements"]["up.weight"].startswith("(Replicate(), Shard(dim=0)")


@pytest.mark.parametrize("layout", ["fsdp_tp", "hsdp"])
def test_the_planted_orphan_is_the_only_error(results, layout):
    r = results[f"{layout} True"]
    assert r["errors"] == ["orphan head2"], r["errors"]
    assert {n: v for n, v in r["verdicts"].items() if v != ["ok"]} == {
        "head2.weight": ["orphan"], "head2.bias": ["orphan"]}
    for n in NAMES:
        assert math.isclose(r["measured"][n], r["oracle"][n], rel_tol=1e-5), n
