"""FSDP1 (`FullyShardedDataParallel`) with `use_orig_params=True` under a real torchrun of 2
processes on gloo (docs/distributed.md, "Engines: what is observed, what is refused"): one unit over
the whole model, and one unit per Linear (nested units, whose names carry FSDP's
`_fsdp_wrapped_module.`). Each with a planted orphan (`head2`, trained by the loss, held by no
optimizer) and its clean twin. Each rank holds a slice of each tensor (some none at all), and
autograd reaches only the views FSDP makes inside forward; the oracle is the same model, data and
bug under DDP: every gradient, `.grad` and change norm must match it, and the names, shapes, lr and
decay must be the model's."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from jobs import same_norm, torchrun_program

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(map(str, (ROOT / "src", ROOT / "tests" / "helpers")))}
STEPS = 3

PROGRAM = textwrap.dedent('''
    import json, sys
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    import diagkit

    STEPS = 3

    from models import TwoHeads as Net, rank_batches, two_heads_groups as groups
    from models import watched_under_ddp

    def batches(n):
        return rank_batches(n, dist.get_rank())

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
    for planted in (True, False):  # the oracle: the same model, data and bug under DDP
        out[f"ddp {planted}"] = summary(watched_under_ddp(planted, STEPS).diagnosis)
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
    dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return torchrun_program(tmp_path_factory.mktemp("fsdp1"), PROGRAM, 2, ENV, timeout=300)




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
        assert all(map(same_norm, got["steps"][key], want)), (key, got["steps"][key], want)
    strip = [row[:2] + row[3:] for row in got["params"]]  # names, whole shapes, lr, decay
    assert strip == [row[:2] + row[3:] for row in oracle["params"]]
    assert {row[2] for row in got["params"]} == {"FSDP1 flat slice"}
