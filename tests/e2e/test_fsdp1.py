"""FSDP1 (`FullyShardedDataParallel`) with `use_orig_params=True` under a real torchrun of 2
processes on gloo (README "Engines: what is observed, what is refused"): one unit over the
whole model, and one unit per Linear (nested units, whose names carry FSDP's
`_fsdp_wrapped_module.`). Each with a planted orphan (`head2`, trained by the loss, held by no
optimizer) and its clean twin. Each rank holds a slice of each tensor (some none at all), and
autograd reaches only the views FSDP makes inside forward; the oracle is the same model, data
and bug under DDP: every gradient, `.grad` and change norm must match it, and the names,
shapes, lr and decay must be the model's."""

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
STEPS = 3

PROGRAM = textwrap.dedent('''
    import json, sys
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    import diagkit

    STEPS = 3

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head, self.head2 = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 3)

        def forward(self, x):
            h = torch.tanh(self.body(x))
            return self.head(h).pow(2).mean() + self.head2(h).pow(2).mean()

    def groups(named, planted):
        held = ("body", "head") + (() if planted else ("head2",))
        return [{"params": [named[f"{m}.weight"] for m in held], "weight_decay": 0.01},
                {"params": [named[f"{m}.bias"] for m in held], "weight_decay": 0.0}]

    def batches(n):
        g = torch.Generator().manual_seed(100 + dist.get_rank())
        return [torch.randn(4, 8, generator=g) for _ in range(n)]

    def summary(d):
        if d is None:
            return None
        cols = ["name", "shape", "placement", "lr", "weight_decay", "optimizer", "group"]
        return {"verdicts": {k: sorted(v) for k, v in d.verdicts().items()},
                "errors": sorted({f.code for f in d.findings if f.severity == "error"}),
                "params": d.params[cols].astype(str).values.tolist(),
                "unused_advice": d.advice["find_unused_parameters"]["recommendation"],
                "steps": {f"{r.step} {r.name}": [r.grad_norm, r.grad_total_norm, r.delta_norm]
                          for r in d.steps.itertuples()}}

    def train(model, opt, w):
        for x in batches(STEPS):
            opt.zero_grad()
            model(x).backward()
            opt.step()
        return summary(w.diagnosis)

    dist.init_process_group("gloo")
    out = {}
    for planted in (True, False):
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(Net())
        opt = torch.optim.Adam(groups(dict(ddp.module.named_parameters()), planted), lr=0.01)
        out[f"ddp {planted}"] = train(ddp, opt, diagkit.watch(ddp, opt, steps=STEPS))
    for nested in (False, True):
        for planted in (True, False):
            torch.manual_seed(0)
            fsdp = FullyShardedDataParallel(
                Net(), use_orig_params=True, device_id=torch.device("cpu"),
                auto_wrap_policy=ModuleWrapPolicy({nn.Linear}) if nested else None)
            named = {n.replace("_fsdp_wrapped_module.", ""): p
                     for n, p in fsdp.named_parameters()}
            opt = torch.optim.Adam(groups(named, planted), lr=0.01)
            out[f"fsdp1 {nested} {planted}"] = train(fsdp, opt,
                                                      diagkit.watch(fsdp, opt, steps=STEPS))
            out[f"slices {nested}"] = sorted(tuple(p.shape) for p in fsdp.parameters())
    if dist.get_rank() == 0:
        json.dump(out, open(sys.argv[1], "w"))
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return torchrun_program(tmp_path_factory.mktemp("fsdp1"), PROGRAM, 2, ENV, timeout=300)


def _close(a, b) -> bool:
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return (a is None or math.isnan(a)) == (b is None or math.isnan(b))
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)


@pytest.mark.parametrize("nested", [False, True])
def test_the_planted_orphan_is_the_only_error(job, nested):
    got = job[f"fsdp1 {nested} True"]
    assert got["errors"] == ["orphan"]
    for name, verdicts in got["verdicts"].items():
        assert verdicts == (["grad_not_cleared", "orphan"] if name.startswith("head2.")
                            else ["ok"]), name


@pytest.mark.parametrize("nested", [False, True])
def test_the_clean_twin_is_all_ok(job, nested):
    got = job[f"fsdp1 {nested} False"]
    assert got["errors"] == [] and len(got["verdicts"]) == 6
    assert all(v == ["ok"] for v in got["verdicts"].values())
    assert "sharded by FSDP1 (FullyShardedDataParallel)" in got["unused_advice"]


@pytest.mark.parametrize("planted", [True, False])
@pytest.mark.parametrize("nested", [False, True])
def test_every_measurement_is_the_one_without_fsdp(job, nested, planted):
    """Rank 0 holds slices (some empty) of the tensors, yet every norm is the whole tensor's:
    the fresh gradient the views received, the reduce-scattered .grad, the change."""
    assert any(shape in ((0,), (64,)) for shape in map(tuple, job[f"slices {nested}"]))
    oracle, got = job[f"ddp {planted}"], job[f"fsdp1 {nested} {planted}"]
    assert set(got["steps"]) == set(oracle["steps"]) and len(oracle["steps"]) == STEPS * 6
    for key, want in oracle["steps"].items():
        assert all(map(_close, got["steps"][key], want)), (key, got["steps"][key], want)
    strip = [row[:2] + row[3:] for row in got["params"]]  # names, whole shapes, lr, decay
    assert strip == [row[:2] + row[3:] for row in oracle["params"]]
    assert {row[2] for row in got["params"]} == {"FSDP1 flat slice"}
