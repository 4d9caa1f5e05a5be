"""Optimizers that step apart (docs/watch.md, "Optimizers that step apart"): forward-forward
training, each layer with its own optimizer trained one after another, is a step per
optimizer step once the others rest, and a tensor is judged on the steps its own optimizer
took; a GAN's critic stepping 5 times per generator step stays one step."""

from __future__ import annotations

import torch
from torch import nn

import diagkit
from diagkit.measure.clock.step_clock import IDLE_AFTER
from models import forward_forward


class Layer(nn.Module):
    def __init__(self, dead=False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        if dead:
            self.dead = nn.Linear(4, 4)  # its optimizer holds it; the forward never uses it

    def forward(self, x):
        return self.fc(x)


def test_layers_trained_one_after_another_are_a_step_per_optimizer_step():
    torch.manual_seed(0)
    layers = nn.ModuleList([Layer(), Layer(dead=True), Layer()])
    opts = [torch.optim.SGD(layer.parameters(), lr=0.05) for layer in layers]
    w = diagkit.watch(layers, opts, steps=100)
    forward_forward(layers, opts, per_layer=15)
    diag = w.stop()
    # the first IDLE_AFTER + 1 steps of each layer are one step, each later one its own
    assert diag.meta["optimizer_steps"] == 3 * (15 - IDLE_AFTER)
    v = diag.verdicts()
    assert v["1.dead.weight"] == {"unused"} == v["1.dead.bias"]
    assert all(v[n] == {"ok"} for n in v if "dead" not in n), v
    params = diag.params.set_index("name")
    assert params.loc["0.fc.weight", "steps"] < diag.meta["steps_observed"]


def test_a_critic_stepping_five_times_per_generator_step_stays_one_step():
    torch.manual_seed(0)
    gen, critic = nn.Linear(2, 4), nn.Linear(4, 1)
    g_opt = torch.optim.SGD(gen.parameters(), lr=0.01)
    c_opt = torch.optim.SGD(critic.parameters(), lr=0.01)
    w = diagkit.watch({"gen": gen, "critic": critic}, [c_opt, g_opt], steps=6)
    for _ in range(6):
        for _ in range(5):
            c_opt.zero_grad()
            critic(gen(torch.randn(3, 2)).detach()).mean().backward()
            c_opt.step()
        g_opt.zero_grad()
        critic(gen(torch.randn(3, 2))).mean().backward()
        g_opt.step()
    diag = w.diagnosis
    assert diag.meta["optimizer_steps"] == 6 and diag.meta["steps_observed"] == 6
    assert set().union(*diag.verdicts().values()) == {"ok"}


class PlainListNet(nn.Module):
    """Forward-forward layers kept in a plain list (`registered=False`), or, as the finding's
    fix says, in an nn.ModuleList."""

    def __init__(self, registered: bool):
        super().__init__()
        layers = [Layer(), Layer()]
        self.layers = nn.ModuleList(layers) if registered else layers


def test_the_optimizers_calls_are_counted_apart_from_the_watchs_steps():
    torch.manual_seed(0)
    net = PlainListNet(registered=True)
    opts = [torch.optim.SGD(layer.parameters(), lr=0.05) for layer in net.layers]
    w = diagkit.watch(net, opts, steps=100)
    forward_forward(list(net.layers), opts, per_layer=20)
    diag = w.stop()
    assert diag.meta["optimizer_calls"] == [20, 20]
    assert diag.meta["optimizer_steps"] == 2 * (20 - IDLE_AFTER)
    # the first step of each turn spans IDLE_AFTER + 1 calls, and the result says so
    assert diag.meta["long_steps"] == [{"step": 0, "calls": IDLE_AFTER + 1},
                                       {"step": 20 - IDLE_AFTER, "calls": IDLE_AFTER + 1}]


def test_layers_in_a_plain_list_are_one_finding_named_by_the_list_and_its_fix_works():
    torch.manual_seed(0)
    net = PlainListNet(registered=False)
    opts = [torch.optim.SGD(layer.parameters(), lr=0.05) for layer in net.layers]
    w = diagkit.watch(net, opts, steps=100)
    forward_forward(net.layers, opts, per_layer=12)
    (finding,) = [f for f in w.stop().findings if f.code == "not_in_model"]
    assert finding.module == "layers" and finding.count == 4
    assert finding.message.startswith("a set of 4 tensors in `layers`")
    assert " is held by an optimizer" in finding.message
    assert "    self.layers = nn.ModuleList(self.layers)" in finding.fix
    # the fix pasted: the same layers, registered; the optimizers as they were
    torch.manual_seed(0)
    net = PlainListNet(registered=True)
    opts = [torch.optim.SGD(layer.parameters(), lr=0.05) for layer in net.layers]
    w = diagkit.watch(net, opts, steps=100)
    forward_forward(list(net.layers), opts, per_layer=12)
    assert set().union(*w.stop().verdicts().values()) == {"ok"}
