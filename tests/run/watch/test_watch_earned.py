"""`diagkit.watch` drops its per-tensor hooks once the user's loop has shown that it resets
.grad to None before each backward and rewrites nothing before the step (`EarnedShare`), and
catches the loop when it stops doing so: that step is dropped and the hooks come back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import diagkit
from diagkit.measure.step import earned_share
from models import MLP, fixed_batch, mse_loss


def hooked(model) -> int:
    return sum(len(p._backward_hooks or {}) for p in model.parameters())


def mlp():
    torch.manual_seed(0)
    model = MLP()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def loop(model, opt, steps, *, zero=lambda s: True, clip=lambda s: None, accumulate=1,
         set_to_none=True):
    """An ordinary loop whose habits can change at a step; returns per step the hook count
    after it and each tensor's gradient norm as backward left it (before any clipping)."""
    batch, hooks, fresh = fixed_batch(), [], []
    for s in range(steps):
        if zero(s):
            opt.zero_grad(set_to_none=set_to_none)
        for _ in range(accumulate):
            mse_loss(model, batch).backward()
        fresh.append({n: float(p.grad.norm()) for n, p in model.named_parameters()})
        if clip(s) is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip(s))
        opt.step()
        hooks.append(hooked(model))
    return hooks, fresh


def grad_norms(diag, step):
    rows = diag.steps[diag.steps["step"] == step]
    return dict(zip(rows["name"], rows["grad_norm"]))


def test_the_standard_loop_earns_hookless_reads_and_measures_the_same():
    model, opt = mlp()
    n = len(list(model.parameters()))
    w = diagkit.watch(model, opt, steps=6)
    hooks, fresh = loop(model, opt, 6)
    diag = w.diagnosis
    assert hooks[:earned_share.EARN_AFTER - 1] == [n] * (earned_share.EARN_AFTER - 1)
    assert hooks[earned_share.EARN_AFTER - 1:] == [0] * (6 - earned_share.EARN_AFTER + 1)
    assert diag.meta["dropped_steps"] == []
    assert sorted(diag.steps["step"].unique()) == list(range(6))
    for s in range(6):  # hooked or not, the fresh gradient's norm
        got = grad_norms(diag, s)
        assert got == pytest.approx(fresh[s], rel=1e-5)
    assert diag.steps["used"].all() and not diag.steps["carried_grad"].any()


def test_the_same_steps_table_with_and_without_earning(monkeypatch):
    tables = []
    for earn_after in (earned_share.EARN_AFTER, 10 ** 6):
        monkeypatch.setattr(earned_share, "EARN_AFTER", earn_after)
        model, opt = mlp()
        w = diagkit.watch(model, opt, steps=5)
        loop(model, opt, 5)
        tables.append(w.diagnosis.steps)
    earned, hooked_all = tables
    for col in ("used", "carried_grad", "changed", "requires_grad", "nonfinite"):
        assert (earned[col].to_numpy() == hooked_all[col].to_numpy()).all(), col
    for col in ("grad_norm", "grad_total_norm", "delta_norm", "lr"):
        np.testing.assert_allclose(earned[col], hooked_all[col], rtol=1e-6)


def test_a_loop_that_stops_clearing_grads_is_caught():
    """From step 4 on nothing clears .grad: that step is dropped, hooks return, and the carried
    gradients of the steps after it are seen (grad_not_cleared)."""
    model, opt = mlp()
    n = len(list(model.parameters()))
    w = diagkit.watch(model, opt, steps=6)
    hooks, _ = loop(model, opt, 8, zero=lambda s: s < 4)
    diag = w.diagnosis
    assert [d["step"] for d in diag.meta["dropped_steps"]] == [4]
    assert "resetting .grad to None" in diag.meta["dropped_steps"][0]["why"]
    assert sorted(diag.steps["step"].unique()) == [0, 1, 2, 3, 5, 6]
    assert hooks[3] == 0 and hooks[4] == n
    later = diag.steps[diag.steps["step"] >= 5]
    assert later["carried_grad"].all() and later["used"].all()
    assert all("grad_not_cleared" in v for v in diag.verdicts().values())


def test_clipping_that_starts_later_is_caught():
    """From step 4 on the loop clips: that step is dropped, and the norms recorded after it are
    again the gradients' before clipping."""
    model, opt = mlp()
    w = diagkit.watch(model, opt, steps=6)
    _, fresh = loop(model, opt, 8, clip=lambda s: 1e-3 if s >= 4 else None)
    diag = w.diagnosis
    assert [d["step"] for d in diag.meta["dropped_steps"]] == [4]
    for s in (5, 6):
        assert grad_norms(diag, s) == pytest.approx(fresh[s], rel=1e-5)
        rows = diag.steps[diag.steps["step"] == s]
        assert (rows["grad_total_norm"] < rows["grad_norm"]).all()  # what the step saw


@pytest.mark.parametrize("habit", [dict(accumulate=2), dict(set_to_none=False),
                                   dict(clip=lambda s: 1e-3), dict(zero=lambda s: False)])
def test_loops_that_never_show_the_standard_facts_stay_hooked(habit):
    model, opt = mlp()
    n = len(list(model.parameters()))
    w = diagkit.watch(model, opt, steps=5)
    hooks, _ = loop(model, opt, 5, **habit)
    assert hooks[:4] == [n] * 4
    assert w.diagnosis.meta["dropped_steps"] == []
    assert sorted(w.diagnosis.steps["step"].unique()) == list(range(5))


def test_an_orphan_stays_hooked_while_held_tensors_are_read_without():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=5)
    hooks, _ = loop(model, opt, 5)
    assert hooks[3] == len(list(model.fc2.parameters()))  # the orphans keep their hooks
    v = w.diagnosis.verdicts()
    assert v["fc2.weight"] == {"orphan", "grad_not_cleared"} and v["fc1.weight"] == {"ok"}


def test_a_stale_grad_left_in_place_is_caught():
    """At step 4 the loop freezes fc1 and clears only fc2: fc1's .grad is last step's tensor,
    unchanged (its version alone looks right). Read without hooks it would pass for this
    step's gradient; it is dropped instead, and the steps after see fc1 unused."""
    model, opt = mlp()
    batch = fixed_batch()
    w = diagkit.watch(model, opt, steps=6)
    for s in range(8):
        if s < 4:
            opt.zero_grad()
        else:
            model.fc1.requires_grad_(False)
            model.fc2.zero_grad()
        mse_loss(model, batch).backward()
        opt.step()
    diag = w.diagnosis
    assert [d["step"] for d in diag.meta["dropped_steps"]] == [4]
    fc1 = diag.steps[(diag.steps["step"] >= 5) & diag.steps["name"].str.startswith("fc1")]
    assert len(fc1) == 4 and not fc1["used"].any() and (fc1["grad_total_norm"] > 0).all()
