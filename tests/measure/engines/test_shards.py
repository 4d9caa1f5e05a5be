"""DTensor parameters on tiny tensors, in a process group of one (in-process HashStore, gloo):
what is measured of them, and what is refused. The ranks' combination is tested on real
`fully_shard` jobs of 2 ranks in `tests/e2e/test_fsdp.py`."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from diagkit.core.errors import DiagkitError
from diagkit.measure.model.inventory import take_inventory
from diagkit.measure.step.observer import Observer
from diagkit.measure.engines.shards import local, placement, reduce_dims


@pytest.fixture
def mesh():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def module_with(param: torch.nn.Parameter) -> torch.nn.Module:
    m = torch.nn.Module()
    m.w = param
    return m


def test_a_shard_is_measured_through_a_view_of_its_storage(mesh):
    p = torch.nn.Parameter(distribute_tensor(torch.arange(6.0), mesh, [Shard(0)]))
    view = local(p)
    assert type(view) is torch.Tensor and placement(p) == "Shard(dim=0)"
    with torch.no_grad():
        p.mul_(2)  # the optimizer's in-place update of the DTensor shows in the view
    assert view.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert reduce_dims(p) == (0,) and placement(torch.zeros(2)) == ""


def test_replicated_dtensors_are_measured_without_combining(mesh):
    p = torch.nn.Parameter(distribute_tensor(torch.ones(3), mesh, [Replicate()]))
    model = module_with(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    obs = Observer(take_inventory(model, [opt]), [opt])
    assert reduce_dims(p) == () and not obs.shards and obs.local[0] is not p
    with obs:
        obs.begin_step(0)
        (p * p).sum().backward()
        opt.step()
        obs.end_step()
    row = obs.steps_table().iloc[0]
    assert row["used"] and row["changed"]
    assert row["grad_norm"] == pytest.approx(2 * 3 ** 0.5)  # d(sum p^2)/dp = 2 at p = 1
    assert row["delta_norm"] == pytest.approx(3 ** 0.5)  # each element moved by 0.5 * 2


def test_a_partial_placement_is_refused_in_one_line(mesh):
    p = torch.nn.Parameter(DTensor.from_local(torch.ones(2), mesh, [Partial()]))
    model = module_with(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(DiagkitError, match=r"placement .*Partial.* \(only Shard, _StridedShard and Replicate\)"):
        Observer(take_inventory(model, [opt]), [opt])
