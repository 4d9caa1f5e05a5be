"""`diagkit.watch(model)` with no optimizer, for loops that update their tensors by hand
(docs/watch.md, "Hand-written updates"): a step ends with each backward, or at each `watch.step()`;
the membership verdicts are not judged (they would call every tensor an orphan)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import diagkit
from diagkit.core.errors import DiagkitError
from models import WithDeadHead, fixed_batch


def sgd_by_hand(model, lr=0.1, only=None):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.grad is not None and (only is None or name.startswith(only)):
                p.add_(p.grad, alpha=-lr)
            p.grad = None


def accumulate_hooks(model) -> int:
    return sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
               for p in model.parameters())


def test_a_step_is_one_backward_and_membership_is_not_judged():
    torch.manual_seed(0)
    model = WithDeadHead()
    w = diagkit.watch(model, steps=4)
    for _ in range(6):
        model(fixed_batch()).pow(2).mean().backward()
        sgd_by_hand(model)
    diag = w.diagnosis
    v = diag.verdicts()
    assert v["dead.weight"] == {"unused"} and v["body.weight"] == {"ok"}
    assert diag.meta["optimizers"] == 0 and diag.meta["steps_observed"] == 4
    assert set(diag.meta["not_judged"]) == {"orphan", "frozen_in_optimizer", "stalled",
                                            "decay_on_norm_or_bias", "in_multiple_optimizers",
                                            "not_in_model"}
    assert [f.code for f in diag.findings] == ["unused"]
    assert accumulate_hooks(model) == 0  # the backward ends' hooks went with the watch


def test_explicit_steps_over_micro_batches_are_the_loops_own():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    w = diagkit.watch(model, steps=3)
    for _ in range(5):
        for _ in range(2):  # two micro-batches: two backwards per step
            model(fixed_batch()).sum().backward()
        sgd_by_hand(model, only="weight")  # the bias is never updated
        w.step()
    diag = w.diagnosis
    assert sorted(diag.steps["step"].unique()) == [0, 1, 2]
    assert not diag.steps["carried_grad"].any()  # the 2nd micro-batch is not a step's start
    params = diag.params.set_index("name")
    assert params.loc["weight", "changed_steps"] == 3 and params.loc["bias", "changed_steps"] == 0


def test_the_whole_run_without_an_optimizer():
    torch.manual_seed(0)
    model = WithDeadHead()
    w = diagkit.watch(model, steps=None, every=3)
    for step in range(30):
        if step == 12:
            model.dead.requires_grad_(False)  # the dead head frozen: the warning ends
        model(fixed_batch()).pow(2).mean().backward()
        sgd_by_hand(model)
    (unused,) = [f for f in w.stop().findings if f.code == "unused"]
    assert (unused.since, unused.ended) == (0, 13)


def test_watch_step_with_an_optimizer_is_refused_in_one_line():
    model = nn.Linear(4, 2)
    w = diagkit.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=2)
    with pytest.raises(DiagkitError, match="^watch.step\\(\\) is for loops without an optimizer"):
        w.step()
    w.stop()
