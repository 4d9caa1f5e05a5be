"""A whole-run watch follows the optimizers the loop actually steps (docs/whole-run.md, "An
optimizer built during the run"): a loop that rebuilds its optimizer when it unfreezes the
backbone is watched on, and the change is an event (issue 36, item 4)."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

import diagkit


def staged(rebuild, steps=60, at=20, every=2):
    """The docs' staged unfreeze: the backbone frozen, the head trained; at step `at` the
    backbone is unfrozen and `rebuild(model)` builds the optimizer the loop uses from then on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[2].parameters(), lr=0.01)
    w = diagkit.watch(model, opt, steps=None, every=every)
    for i in range(steps):
        if i == at:
            model[0].requires_grad_(True)
            opt = rebuild(model)
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    return w.stop(), model


def forgets_backbone(model):
    return torch.optim.SGD(model[2].parameters(), lr=0.01)


def whole_model(model):
    return torch.optim.SGD(model.parameters(), lr=0.01)


def test_a_rebuild_that_leaves_the_backbone_out_is_an_orphan_from_that_step(caplog):
    with caplog.at_level(logging.INFO, logger="diagkit"):
        diag, _ = staged(forgets_backbone)
    codes = {f.code for f in diag.findings}
    assert "orphan" in codes
    (orphan,) = [f for f in diag.findings if f.code == "orphan"]
    assert set(orphan.params) == {"0.weight", "0.bias"} and orphan.since == 21
    assert diag.meta["optimizer_steps"] == 60  # every step counted, the new optimizer's too
    (event,) = [e for e in diag.meta["events"] if e["kind"] == "optimizer"]
    assert event["step"] == 20 and "replaced optimizer 0" in event["what"]
    # step 20 was observed with the old optimizer's facts: dropped, saying why
    assert {"step": 20, "why": "a new optimizer stepped during it"} in diag.meta["dropped_steps"]
    assert any("replaced optimizer 0" in r.getMessage() for r in caplog.records)


def test_a_correct_rebuild_is_clean_and_every_step_is_counted():
    diag, _ = staged(whole_model)
    assert [f.code for f in diag.findings if f.severity in ("warning", "error")] == []
    assert diag.meta["optimizer_steps"] == 60
    rows = diag.params.set_index("name")
    assert rows.loc["0.weight", "optimizer"] == 0  # held by the new optimizer, as watched
    assert [e["kind"] for e in diag.meta["events"]] == ["requires_grad", "optimizer"]
    # after the change the whole model is observed stepping: the backbone changes
    assert diag.steps.query("name == '0.weight' and step > 20")["changed"].astype(bool).all()


def test_an_optimizer_of_another_model_is_not_followed():
    torch.manual_seed(0)
    model, other = nn.Linear(4, 2), nn.Linear(4, 2)
    opt, other_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, other))
    w = diagkit.watch(model, opt, steps=None, every=1)
    for _ in range(12):
        for m, o in ((model, opt), (other, other_opt)):
            o.zero_grad()
            m(torch.randn(3, 4)).sum().backward()
            o.step()
    diag = w.stop()
    assert diag.meta["events"] == [] and diag.meta["optimizer_steps"] == 12
    assert set(diag.params["name"]) == {"weight", "bias"}


def test_two_live_optimizers_over_the_same_tensors_are_two_events_not_one_per_step():
    """The old optimizer steps again after a newer one replaced it: both are live, so it
    joins them; nothing flips back and forth."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, first, steps=None, every=1)
    second = None
    for i in range(30):
        if i == 10:
            second = torch.optim.SGD([model.weight], lr=0.1)
        for opt in (first, second) if second is not None else (first,):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    diag = w.stop()
    optimizer_events = [e for e in diag.meta["events"] if e["kind"] == "optimizer"]
    # loop step 10: `first` ends watch step 10, `second` steps first in step 11 (replacing
    # `first`), `first` steps again in step 12 (back: it joins)
    assert [e["step"] for e in optimizer_events] == [11, 12]
    assert "replaced optimizer 0" in optimizer_events[0]["what"]
    assert "joined" in optimizer_events[1]["what"]
    # and what the loop does is judged: the weight is stepped by both
    assert "in_multiple_optimizers" in {f.code for f in diag.findings}


def test_nothing_of_the_watch_stays_in_torch_after_stop():
    before = dict(torch_optimizer._global_optimizer_pre_hooks)
    diag, _ = staged(forgets_backbone, steps=25)
    assert dict(torch_optimizer._global_optimizer_pre_hooks) == before
    assert diag is not None


class Lookahead(torch.optim.Optimizer):
    """A wrapper optimizer stepping an inner one over the same tensors (as Lookahead does)."""

    def __init__(self, params, lr=0.1):
        params = list(params)
        super().__init__(params, {"lr": lr})
        self.inner = None  # built lazily: the watch meets it only at its first step
        self.params_ = params

    @torch.no_grad()
    def step(self, closure=None):
        if self.inner is None:
            self.inner = torch.optim.SGD(self.params_, lr=self.defaults["lr"])
        self.inner.step()


def test_an_optimizer_stepped_inside_the_watched_one_is_not_taken_for_a_rebuild():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = Lookahead(model.parameters())
    w = diagkit.watch(model, opt, steps=None, every=1)
    for _ in range(12):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    diag = w.stop()
    assert diag.meta["events"] == [] and diag.meta["optimizer_steps"] == 12
    assert [f.code for f in diag.findings if f.severity in ("warning", "error")] == []
