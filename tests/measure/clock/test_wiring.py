"""`measure.clock.wiring`: a wiring change is reported exactly when a brute-force snapshot of the
wiring differs, whatever sequence of changes a run makes (hypothesis)."""

from __future__ import annotations

import contextlib
import weakref
from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from diagkit.measure.model.inventory import group_lr
from diagkit.measure.clock import wiring as wiring_module
from diagkit.measure.clock.wiring import Wiring
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


# ---- The change check against a brute-force oracle, event for event (issue 25) -------------

class OddParam(nn.Parameter):
    """A Parameter subclass: read through `map`, never through the C `any` (not a plain type)."""


class Serials:
    """One number per object for as long as it lives: a new tensor at a freed tensor's address
    gets a new number, so the oracle is not fooled by an id used again."""

    def __init__(self):
        self.by_id, self.next = {}, 0

    def __call__(self, obj) -> int:
        ref, serial = self.by_id.get(id(obj), (None, None))
        if ref is None or ref() is not obj:
            self.next += 1
            ref, serial = weakref.ref(obj), self.next
            self.by_id[id(obj)] = (ref, serial)
        return serial


class Oracle:
    """The wiring recomputed in full at every ask (every parameter, flag, member and lr read
    anew), said with the same event wording as `Wiring`: what `Wiring.changes` must equal."""

    def __init__(self, model, optimizers):
        self.model, self.optimizers, self.serial = model, optimizers, Serials()
        self.seen = self.snapshot()

    def snapshot(self):
        named = list(dict((id(p), (n, p)) for n, p in reversed(
            list(self.model.named_parameters()))).values())[::-1]  # first name per tensor
        groups = tuple(tuple((tuple(map(self.serial, g["params"])), group_lr(g) == 0)
                             for g in o.param_groups) for o in self.optimizers)
        return ([n for n, _ in named], tuple(self.serial(p) for _, p in named),
                tuple(p.requires_grad for _, p in named), groups, [p for _, p in named])

    def changes(self, step):
        (old_names, old_ids, old_flags, old_groups, _), new = self.seen, self.snapshot()
        self.seen = new
        names, ids, flags, groups, _ = new
        events = []
        if ids != old_ids:
            events.append(wiring_module._parameters_event(step, old_names, old_ids, names, ids))
        elif flags != old_flags:
            events += wiring_module._flag_events(step, names, old_flags, flags)
        if groups != old_groups:
            events += wiring_module._group_events(step, old_groups, groups)
        return events


MUTATIONS = ["flip", "set_flag", "detach", "freeze_module", "lr0", "lr1", "lr_tensor",
             "replace_module", "set_param", "scalar_param", "add_group", "member_replace",
             "member_equal_value", "member_append", "member_pop", "pop_push", "swap",
             "same_member", "list_copy", "as_tuple", "nothing"]
STEPS = st.lists(st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 7)),
                          max_size=3), min_size=1, max_size=10)


def members_of(opt, k):
    """Group `k % n`'s params as a list one can mutate (a tuple made one: no change)."""
    group = opt.param_groups[k % len(opt.param_groups)]
    if not isinstance(group["params"], list):
        group["params"] = list(group["params"])
    return group["params"]


def mutate(op, k, model, opts):
    """One change a run can make between two optimizer steps (or none: `same_member`,
    `list_copy`, `as_tuple` and `nothing` leave the wiring as it was)."""
    params, opt = list(model.parameters()), opts[k % len(opts)]
    p, members = params[k % len(params)], members_of(opt, k)
    i = k % len(members) if members else 0
    if op == "flip":
        p.requires_grad_(not p.requires_grad)
    elif op == "set_flag":
        p.requires_grad = bool(k % 2)
    elif op == "detach":
        p.detach_()
    elif op == "freeze_module":
        model.fc1.requires_grad_(bool(k % 2))
    elif op in ("lr0", "lr1", "lr_tensor"):
        lr = {"lr0": 0.0, "lr1": 0.1, "lr_tensor": torch.tensor(0.1 * (k % 2))}[op]
        opt.param_groups[k % len(opt.param_groups)]["lr"] = lr
    elif op == "replace_module":
        model.fc2 = nn.Linear(5, 3)
    elif op == "set_param":
        model.fc1.bias = (OddParam if k % 2 else nn.Parameter)(torch.zeros(5))
    elif op == "scalar_param":
        model.scale = nn.Parameter(torch.ones(1))
    elif op == "add_group":
        held = {id(q) for o in opts for g in o.param_groups for q in g["params"]}
        fresh = [q for q in params if id(q) not in held] or [nn.Parameter(torch.zeros(2))]
        opt.add_param_group({"params": fresh[:1]})
    elif op == "member_replace" and members:
        members[i] = params[(k + 1) % len(params)]
    elif op == "member_equal_value" and members:  # `==` would call it the same: it is not
        members[i] = members[i].detach().clone().requires_grad_(members[i].requires_grad)
    elif op == "member_append":
        members.append(p if k % 2 else nn.Parameter(torch.ones(1)))
    elif op == "member_pop" and members:
        members.pop(i)
    elif op == "pop_push" and members:  # the new tensor may take the old one's address
        shape = members.pop(i).shape
        members.insert(i, nn.Parameter(torch.ones(shape)))
    elif op == "swap" and len(members) > 1:
        members[0], members[-1] = members[-1], members[0]
    elif op == "same_member" and members:
        members[i] = members[i]
    elif op == "list_copy":
        opt.param_groups[k % len(opt.param_groups)]["params"] = list(members)
    elif op == "as_tuple":
        opt.param_groups[k % len(opt.param_groups)]["params"] = tuple(members)


FAST_PATHS = {"fast": {}, "no_c_any": {"_any_requires_grad": lambda: None}}


@pytest.mark.parametrize("paths", list(FAST_PATHS))
@settings(max_examples=80, deadline=None)
@given(STEPS)
def test_the_events_are_the_oracles_whatever_the_mutations(paths, steps):
    torch.manual_seed(0)
    model = MLP()
    model.scale = nn.Parameter(torch.ones(1))
    model.odd = OddParam(torch.zeros(2))
    opts = [torch.optim.SGD([*model.fc1.parameters(), model.scale], lr=0.1),
            torch.optim.SGD([*model.fc2.parameters(), model.odd], lr=0.1)]
    model.fc2.bias.requires_grad_(False)  # frozen from the start: the C `any` has one
    with contextlib.ExitStack() as stack:
        for name, replacement in FAST_PATHS[paths].items():
            stack.enter_context(mock.patch.object(wiring_module, name, replacement))
        wiring, oracle = Wiring(model, opts), Oracle(model, opts)
        try:
            for step, ops in enumerate(steps):
                for op, k in ops:
                    mutate(op, k, model, opts)
                assert wiring.changes(step) == oracle.changes(step), (step, ops)
        finally:
            wiring.release()


def test_members_are_compared_by_identity_never_by_value():
    one = nn.Parameter(torch.ones(1))
    members = (one, nn.Parameter(torch.zeros(3)))
    assert wiring_module._same_members(list(members), members)
    assert wiring_module._same_members(tuple(members), members)
    twin = one.detach().clone()  # `twin == one` is True: a 1-element tensor of the same value
    assert not wiring_module._same_members([twin, members[1]], members)
    assert not wiring_module._same_members(list(members)[::-1], members)
    assert not wiring_module._same_members([one], members)
    assert wiring_module._same_members([], ())


def test_the_fast_path_is_on_here():
    """The pinned torch takes the one C call for frozen tensors: the oracle test above runs
    it, not only the fallback."""
    assert wiring_module._any_requires_grad() is not None
