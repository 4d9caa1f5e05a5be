"""`measure.wiring`: a wiring change is reported exactly when a brute-force snapshot of the
wiring differs, whatever sequence of changes a run makes (hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from diagkit.measure.inventory import group_lr
from diagkit.measure.wiring import Wiring
from models import MLP


def snapshot(model, optimizers):
    """Everything the wiring is, walked in full: the oracle."""
    params = tuple((name, id(p), p.requires_grad) for name, p in model.named_parameters())
    groups = tuple(tuple((tuple(map(id, g["params"])), group_lr(g) == 0) for g in o.param_groups)
                   for o in optimizers)
    return params, groups


OPS = st.lists(st.tuples(st.sampled_from(["flip", "lr0", "lr1", "replace", "set_param",
                                          "add_group", "nothing"]),
                         st.integers(0, 3)), min_size=1, max_size=12)


def apply(op, k, model, opt):
    params = list(model.parameters())
    if op == "flip":
        p = params[k % len(params)]
        p.requires_grad_(not p.requires_grad)
    elif op in ("lr0", "lr1"):
        opt.param_groups[k % len(opt.param_groups)]["lr"] = 0.0 if op == "lr0" else 0.1
    elif op == "replace":
        model.fc2 = nn.Linear(5, 3)
    elif op == "set_param":
        model.fc1.bias = nn.Parameter(torch.zeros(5))
    elif op == "add_group":
        fresh = [p for p in model.parameters()
                 if not any(p is q for g in opt.param_groups for q in g["params"])]
        if fresh:
            opt.add_param_group({"params": fresh[:1]})


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_a_change_is_reported_exactly_when_the_wiring_differs(ops):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    wiring = Wiring(model, [opt])
    try:
        for step, (op, k) in enumerate(ops):
            before = snapshot(model, [opt])
            apply(op, k, model, opt)
            events = wiring.changes(step)
            assert bool(events) == (snapshot(model, [opt]) != before), (op, events)
            assert all(e["step"] == step and e["what"] for e in events)
    finally:
        wiring.release()


def test_the_events_say_what_changed():
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    wiring = Wiring(model, [opt])
    model.fc2.requires_grad_(False)
    (event,) = wiring.changes(3)
    assert event["kind"] == "requires_grad" and event["names"] == ["fc2.weight", "fc2.bias"]
    assert "was frozen" in event["what"]
    opt.param_groups[0]["lr"] = 0.0
    model.fc2 = nn.Linear(5, 3)
    kinds = {e["kind"]: e["what"] for e in wiring.changes(4)}
    assert "replaced fc2.weight, fc2.bias" in kinds["parameters"]
    assert kinds["lr"] == "optimizer 0 group 0's lr reached 0"
    assert wiring.changes(5) == []
    wiring.release()


def test_release_removes_the_module_hooks():
    from torch.nn.modules import module as m
    before = (len(m._global_parameter_registration_hooks), len(m._global_module_registration_hooks))
    wiring = Wiring(MLP(), [])
    wiring.release()
    assert (len(m._global_parameter_registration_hooks),
            len(m._global_module_registration_hooks)) == before
