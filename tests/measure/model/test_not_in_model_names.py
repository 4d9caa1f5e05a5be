"""A tensor an optimizer holds but the model does not is named by where it lives among the
model's plain attributes, as an `unregistered` one is (issue 21, section 5): a module kept in a
plain list gives `layers[0].weight`, not `<optimizer 0 group 0 #0>`. One the model cannot reach
keeps the optimizer's name."""

from __future__ import annotations

import torch
from torch import nn

import diagkit
from diagkit.measure.model.inventory import take_inventory


class PlainList(nn.Module):
    """A head registered, a layer kept in a plain list (the bug), and a plain tensor."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 2)
        self.layers = [nn.Linear(4, 4)]
        self.temperature = torch.ones(2, requires_grad=True)

    def forward(self, x):
        return self.head(self.layers[0](x)) * self.temperature


def test_the_inventory_names_optimizer_only_tensors_by_their_path():
    model = PlainList()
    loose = nn.Parameter(torch.ones(3))  # reachable from nothing of the model
    opt = torch.optim.SGD([*model.layers[0].parameters(), model.temperature, loose], lr=0.1)
    rows = {row["name"]: row for row in take_inventory(model, [opt]).rows}
    assert list(rows) == ["head.weight", "head.bias", "layers[0].weight", "layers[0].bias",
                          "temperature", "<optimizer 0 group 0 #3>"]
    assert (rows["layers[0].weight"]["module"], rows["layers[0].weight"]["module_type"]) == (
        "layers[0]", "Linear")
    assert not rows["layers[0].weight"]["in_model"]
    assert rows["layers[0].bias"]["memberships"] == ((0, 0),)
    assert rows["<optimizer 0 group 0 #3>"]["module"] == ""


def test_diagnose_and_watch_report_not_in_model_under_the_path():
    torch.manual_seed(0)
    model = PlainList()
    opt = torch.optim.SGD([*model.parameters(), *model.layers[0].parameters(),
                           model.temperature], lr=0.1)
    x = torch.randn(3, 4)
    expected = {"head.weight": {"ok"}, "head.bias": {"ok"}, "layers[0].weight": {"not_in_model"},
                "layers[0].bias": {"not_in_model"}, "temperature": {"not_in_model"}}
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x,
                            loss_fn=lambda m, b: m(b).pow(2).mean(), steps=2)
    assert diag.verdicts() == expected
    # one finding per attribute, each with the registration it calls for (issue 36, item 6)
    found = {f.module: f for f in diag.findings if f.code == "not_in_model"}
    assert set(found) == {"layers", "temperature"}
    assert set(found["layers"].params) == {"layers[0].weight", "layers[0].bias"}
    assert "`layers[0].weight`" in found["layers"].message
    assert "self.layers = nn.ModuleList(self.layers)" in found["layers"].fix
    assert "self.temperature = nn.Parameter(self.temperature)" in found["temperature"].fix
    w = diagkit.watch(model, opt, steps=2)
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    assert w.diagnosis.verdicts() == expected
