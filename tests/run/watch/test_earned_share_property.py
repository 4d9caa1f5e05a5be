"""The hookless fast path of `diagkit.watch` (`measure/step/earned_share.py`) makes observing cheaper
and never changes a verdict nor drops a step (docs/watch.md, "Its cost"): property-based tests
(hypothesis) run one loop twice on identical models, with the fast path on and off, over
branches used from the start, first used late, used once, at random or never, the ways a loop
clears .grad, accumulation and clipping; plus the branch of issue 36 taken at one step and
forward-forward's hand-over from one layer's optimizer to the next."""

from __future__ import annotations

import contextlib
from unittest import mock

import pandas as pd
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn

import diagkit
from diagkit.measure.step.state import LoopFacts
from diagkit.run.watch import watch as watch_module
from models import forward_forward

STEPS = 8
SAME = settings(derandomize=True, max_examples=30, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


class Branchy(nn.Module):
    """A trunk always used and branches each used on the steps its pattern says."""

    def __init__(self, n_branches: int):
        super().__init__()
        self.trunk = nn.Linear(3, 3)
        self.branches = nn.ModuleList(nn.Linear(3, 3) for _ in range(n_branches))

    def forward(self, x, used):
        h = self.trunk(x)
        out = h
        for j in used:
            out = out + self.branches[j](h)
        return out.pow(2).mean()


@contextlib.contextmanager
def fast_path(on: bool):
    """The watch as it is (fast path on), or as under a process group (every tensor hooked)."""
    if on:
        yield
        return
    with mock.patch.object(watch_module, "LoopFacts",
                           lambda **kw: LoopFacts(**{**kw, "may_earn_shares": False})):
        yield


def pattern(kind: str, at: int, rand: list[bool]) -> list[bool]:
    """Per step, whether a branch is used."""
    return [{"start": True, "late": s >= at, "once": s == at, "never": False,
             "random": rand[s]}[kind] for s in range(STEPS)]


def run(on: bool, uses: list[list[bool]], clear: str, accumulate: int, clip: bool,
        split: bool):
    """The loop, watched with the fast path on or off: its diagnosis."""
    torch.manual_seed(0)
    model = Branchy(len(uses))
    if split:  # the branches under an optimizer of their own, stepping with the trunk's
        opts = [torch.optim.SGD(model.trunk.parameters(), lr=0.05),
                torch.optim.SGD(model.branches.parameters(), lr=0.05, momentum=0.9)]
    else:
        opts = [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)]
    gen = torch.Generator().manual_seed(1)
    with fast_path(on):  # on for the whole loop: an observer may be built at any step
        w = diagkit.watch(model, opts, steps=STEPS, live=False)
        for s in range(STEPS):
            if clear == "model":
                model.zero_grad()
            elif clear != "none":
                for opt in opts:
                    opt.zero_grad(set_to_none=clear == "set_to_none")
            used = [j for j, u in enumerate(uses) if u[s]]
            for _ in range(accumulate):
                model(torch.randn(4, 3, generator=gen), used).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            for opt in opts:
                opt.step()
        return w.stop()


def assert_same(fast, hooked) -> None:
    assert fast.meta["dropped_steps"] == hooked.meta["dropped_steps"] == []
    assert fast.verdicts() == hooked.verdicts()
    rows = [d.steps.sort_values(["step", "name"]).reset_index(drop=True) for d in (fast, hooked)]
    pd.testing.assert_frame_equal(*rows, check_exact=False, rtol=1e-6)


KINDS = st.sampled_from(["start", "late", "once", "never", "random"])


@SAME
@given(branches=st.lists(st.tuples(KINDS, st.integers(0, STEPS - 1),
                                   st.lists(st.booleans(), min_size=STEPS, max_size=STEPS)),
                         min_size=1, max_size=4),
       clear=st.sampled_from(["set_to_none", "in_place", "model", "none"]),
       accumulate=st.sampled_from([1, 2]), clip=st.booleans(), split=st.booleans())
# Branches taking turns, their own optimizer's, under a loop that zeroes in place or never: an
# unused branch's .grad is an old one (read as the optimizer steps), so nothing is earned.
@example(branches=[("once", 0, [False] * STEPS), ("late", 1, [False] * STEPS)],
         clear="in_place", accumulate=1, clip=False, split=True)
@example(branches=[("once", 0, [False] * STEPS), ("once", 1, [False] * STEPS)],
         clear="none", accumulate=1, clip=False, split=True)
def test_the_fast_path_never_changes_a_verdict_nor_a_step(branches, clear, accumulate, clip,
                                                           split):
    uses = [pattern(*b) for b in branches]
    args = (uses, clear, accumulate, clip, split)
    assert_same(run(True, *args), run(False, *args))


@SAME
@given(uses=st.lists(st.lists(st.booleans(), min_size=STEPS, max_size=STEPS),
                     min_size=1, max_size=4), split=st.booleans())
def test_the_standard_loop_with_branches_at_random(uses, split):
    """The loop that earns the fast path, its branches used at random: the same."""
    args = (uses, "set_to_none", 1, False, split)
    assert_same(run(True, *args), run(False, *args))


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, use_b):
        h = self.a(x)
        return (self.b(h) if use_b else h).sum()


def hooks(module) -> int:
    return sum(len(p._backward_hooks or {}) for p in module.parameters())


def branch_at(at: set[int]):
    """Issue 36's loop: `b` used on the steps `at` only. The diagnosis, and per step the hooks
    on `a` and on `b` after it."""
    torch.manual_seed(0)
    m = TwoBranches()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    w = diagkit.watch(m, opt, steps=10, live=False)
    seen = []
    for step in range(10):
        opt.zero_grad()
        m(torch.randn(2, 4), use_b=step in at).backward()
        opt.step()
        seen.append((hooks(m.a), hooks(m.b)))
    return w.diagnosis, seen


def test_a_branch_used_on_one_step_is_intermittent_not_unused():
    diag, seen = branch_at({4})
    assert diag.meta["dropped_steps"] == []
    assert sorted(diag.steps["step"].unique()) == list(range(10))
    v = diag.verdicts()
    assert v["b.weight"] == {"intermittent"} == v["b.bias"]
    assert v["a.weight"] == {"ok"} == v["a.bias"]
    b = diag.params.set_index("name").loc["b.weight"]
    assert b["used_steps"] == 1
    # `a` is read without hooks from step 1 on; `b`, with no gradient then, keeps its hooks
    assert seen[1] == (0, 2) and seen[8] == (0, 2)  # (the watch detaches after step 9)


def test_a_branch_used_on_two_steps():
    diag, _ = branch_at({4, 7})
    assert diag.meta["dropped_steps"] == []
    b = diag.params.set_index("name").loc["b.weight"]
    assert b["used_steps"] == 2 and b["steps"] == 10
    assert diag.verdicts()["b.weight"] == {"intermittent"}
    rows = diag.steps[diag.steps["name"] == "b.weight"].set_index("step")
    assert rows["used"].tolist() == [s in (4, 7) for s in range(10)]


def test_forward_forward_hands_over_without_a_dropped_step():
    """Layer-local optimizers taking turns: each next layer's first gradient comes at its
    hand-over step, hooked (its optimizer's tensors had none before), so no step is dropped and
    every optimizer step of a resting neighbour's turn is a step."""
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
    opts = [torch.optim.SGD(layer.parameters(), lr=0.05) for layer in layers]
    w = diagkit.watch(layers, opts, steps=100, live=False)
    forward_forward(layers, opts, per_layer=12)
    diag = w.stop()
    assert diag.meta["dropped_steps"] == []
    assert diag.meta["steps_observed"] == diag.meta["optimizer_steps"]
    assert all(v == {"ok"} for v in diag.verdicts().values()), diag.verdicts()
