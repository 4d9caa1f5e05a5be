"""`take_inventory` and `group_lr`: which tensors exist, their static facts, and which
optimizer groups hold them, all decided by identity (tied weights, optimizer-only tensors, a
tensor held by two optimizers, a tensor lr)."""

from __future__ import annotations

import math

import torch
from torch import nn

from diagkit.measure.model.inventory import group_lr, take_inventory


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(4, 3)
        self.head = nn.Linear(3, 4, bias=False)
        self.head.weight = self.emb.weight
        self.scale = nn.Parameter(torch.ones(2, dtype=torch.float64))


def rows_by_name(inv):
    return {row["name"]: row for row in inv.rows}


def test_tied_weights_are_one_row_with_aliases():
    model = Tied()
    inv = take_inventory(model, [])
    assert inv.names == ["scale", "emb.weight"]  # named_parameters() order: own ones first
    assert len(inv.tensors) == 2 and inv.tensors[1] is model.emb.weight
    emb = rows_by_name(inv)["emb.weight"]
    assert emb["aliases"] == ("head.weight",)
    assert (emb["module"], emb["module_type"]) == ("emb", "Embedding")


def test_static_facts_of_a_row():
    model = Tied()
    model.scale.requires_grad_(False)
    scale = rows_by_name(take_inventory(model, []))["scale"]
    assert (scale["module"], scale["module_type"]) == ("", "Tied")  # the root owns it
    assert scale["shape"] == (2,) and scale["numel"] == 2 and scale["bytes"] == 16
    assert scale["dtype"] == "torch.float64" and scale["device"] == "cpu"
    assert scale["in_model"] is True and scale["requires_grad"] is False
    assert scale["memberships"] == () and scale["n_optimizers"] == 0
    assert scale["optimizer"] is None and scale["group"] is None
    assert math.isnan(scale["lr"]) and math.isnan(scale["weight_decay"])


def test_membership_is_identity_not_value_or_name():
    model = nn.Linear(2, 2)
    lookalike = nn.Parameter(model.weight.detach().clone())  # same values, another tensor
    extra = nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([{"params": [model.bias]},
                           {"params": [lookalike, extra], "lr": 0.5}], lr=0.1)
    inv = take_inventory(model, [opt])
    assert inv.names == ["weight", "bias", "<optimizer 0 group 1 #0>",
                         "<optimizer 0 group 1 #1>"]
    assert inv.tensors[2] is lookalike and inv.tensors[3] is extra
    rows = rows_by_name(inv)
    assert rows["weight"]["memberships"] == ()  # its look-alike does not count
    assert rows["bias"]["memberships"] == ((0, 0),) and rows["bias"]["lr"] == 0.1
    for name in ("<optimizer 0 group 1 #0>", "<optimizer 0 group 1 #1>"):
        row = rows[name]
        assert row["in_model"] is False and row["module"] == "" and row["module_type"] == ""
        assert row["memberships"] == ((0, 1),) and (row["optimizer"], row["group"]) == (0, 1)
        assert row["lr"] == 0.5
    assert inv.first_group == [None, (0, 0), (0, 1), (0, 1)]


def test_tensor_held_by_two_optimizers():
    model = nn.Linear(2, 1)
    first = torch.optim.SGD([model.weight], lr=0.1)
    second = torch.optim.AdamW([{"params": [model.bias], "lr": 0.01},
                                {"params": [model.weight], "lr": 0.02, "weight_decay": 0.3}])
    inv = take_inventory(model, [first, second])
    rows = rows_by_name(inv)
    w, b = rows["weight"], rows["bias"]
    assert w["memberships"] == ((0, 0), (1, 1)) and w["n_optimizers"] == 2
    assert (w["optimizer"], w["group"]) == (0, 0) and inv.first_group[0] == (0, 0)
    assert w["lr"] == 0.1  # its first group's
    assert w["weight_decay"] == 0.0  # its own (first) group's, not optimizer 1's 0.3
    assert b["memberships"] == ((1, 0),) and b["n_optimizers"] == 1
    assert b["lr"] == 0.01 and b["weight_decay"] == 0.01  # AdamW's default decay


def test_weight_decay_of_the_first_group_when_none_decays():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD([{"params": [model.weight], "weight_decay": 0.0},
                           {"params": [model.bias], "weight_decay": 0.2}], lr=0.1)
    rows = rows_by_name(take_inventory(model, [opt]))
    assert rows["weight"]["weight_decay"] == 0.0 and rows["bias"]["weight_decay"] == 0.2


def test_same_tensor_twice_in_one_group_is_one_membership():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.param_groups[0]["params"].append(model.weight)  # listed twice (bypassing the check)
    inv = take_inventory(model, [opt])
    assert len(inv.rows) == 2
    assert rows_by_name(inv)["weight"]["memberships"] == ((0, 0),)


def test_two_optimizers_share_an_optimizer_only_tensor():
    model = nn.Linear(3, 3)  # far larger than `loose`: no flat buffer (`measure.engines.refused`)
    loose = nn.Parameter(torch.ones(2))
    a = torch.optim.SGD([loose], lr=0.1)
    b = torch.optim.SGD([loose], lr=0.2)
    inv = take_inventory(model, [a, b])
    assert inv.names[-1] == "<optimizer 0 group 0 #0>" and len(inv.rows) == 3
    row = inv.rows[-1]
    assert row["memberships"] == ((0, 0), (1, 0)) and row["n_optimizers"] == 2
    assert row["lr"] == 0.1


def test_group_lr():
    assert group_lr({"lr": 0.25}) == 0.25
    assert group_lr({"lr": 3}) == 3.0 and isinstance(group_lr({"lr": 3}), float)
    assert group_lr({"lr": torch.tensor(0.125)}) == 0.125
    got = group_lr({"lr": torch.tensor(0.01)})
    assert isinstance(got, float) and got == float(torch.tensor(0.01))
    assert math.isnan(group_lr({"params": []}))


def test_tensor_lr_in_an_optimizer_row():
    model = nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.5))
    rows = rows_by_name(take_inventory(model, [opt]))
    assert rows["weight"]["lr"] == 0.5 and isinstance(rows["weight"]["lr"], float)
