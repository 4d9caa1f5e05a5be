"""`Observer` on tiny models: what each steps-table column records, against the tensors.

used / grad_norm / grad_total_norm / carried_grad (incl. accumulation, clipping, zero and tiny
gradients), delta_norm / changed / update_ratio against the real change, requires_grad and lr
read at optimizer-step time, nonfinite, tensors no optimizer holds, hooks removed on exit (also
when the body raises), abort_step, step_table, and the two strategies (hooks everywhere vs
hookless optimizer shares) agreeing.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from diagkit.core.schema import STEPS_COLUMNS
from diagkit.measure.model.inventory import take_inventory
from diagkit.measure.batched import kernels
from diagkit.measure.batched.kernels import checksum
from diagkit.measure.step.observer import Observer
from diagkit.measure.step.state import LoopFacts

HOOKS, HOOKLESS = LoopFacts(), LoopFacts(grads_untouched_until_step=True,
                                         held_grads_start_none=True)
STRATEGIES = pytest.mark.parametrize("loop", [HOOKS, HOOKLESS], ids=["hooks", "hookless"])
X = torch.tensor([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]])


class Net(nn.Module):
    """`lin` is reached by the loss, `spare` never."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)
        self.spare = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return (self.lin(x) ** 2).sum()


class Toy(nn.Module):
    """grad of `w` is exactly x; `v` gets 2v; `u` is never reached."""

    def __init__(self):
        super().__init__()
        self.w, self.v, self.u = (nn.Parameter(torch.ones(n)) for n in (3, 2, 2))

    def forward(self, x):
        return (self.w * x).sum() + (self.v ** 2).sum()


def vnorm(t) -> float:
    return math.nan if t is None else float(torch.linalg.vector_norm(t.double()))


def clones(ts):
    return [None if t is None else t.detach().clone() for t in ts]


def step(obs, model, opts, i, x=X, zero=True, between=None, after=None):
    """One observed step; returns its rows by name and what the tensors did."""
    ts, value0 = obs.tensors, clones(obs.tensors)
    obs.begin_step(i)
    for opt in opts if zero else ():
        opt.zero_grad(set_to_none=zero != "zeros")
    grad0, loss = clones([t.grad for t in ts]), model(x)
    loss.backward()
    grad1 = clones([t.grad for t in ts])
    (between or (lambda: None))()
    for opt in opts:
        opt.step()
    (after or (lambda: None))()
    obs.end_step(loss)
    rows = obs.step_table(i).set_index("name")
    facts = {n: dict(value0=v0, value1=t.detach().clone(), grad0=g0, grad1=g1)
             for n, t, v0, g0, g1 in zip(obs.inv.names, ts, value0, grad0, grad1)}
    return rows, facts


def observer(model, opts, loop=HOOKS, **kw):
    return Observer(take_inventory(model, opts), opts, loop=loop, **kw)


def assert_change(row, f):
    delta = vnorm(f["value1"] - f["value0"])
    assert row.delta_norm == pytest.approx(delta, rel=1e-5)
    assert row.changed == (delta > 0)
    assert row.update_ratio == pytest.approx(delta / vnorm(f["value0"]), rel=1e-5)


@STRATEGIES
def test_used_norms_and_change(loop):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with observer(model, [opt], loop) as obs:
        for i in range(3):
            rows, facts = step(obs, model, [opt], i)
            for name in ("lin.weight", "lin.bias"):
                r, f = rows.loc[name], facts[name]
                assert r.used and r.requires_grad and not r.carried_grad and not r.nonfinite
                assert r.grad_norm == pytest.approx(vnorm(f["grad1"]), rel=1e-6)
                assert r.grad_total_norm == pytest.approx(vnorm(f["grad1"]), rel=1e-6)
                assert r.lr == 0.1 and r.changed
                assert_change(r, f)
            s = rows.loc["spare"]
            assert not s.used and not s.changed and s.delta_norm == 0.0
            assert np.isnan(s.grad_norm) and np.isnan(s.grad_total_norm)
    assert len(obs.losses) == 3 and obs.losses[0] == pytest.approx(float(Net()(X).detach()))


def test_carried_grad_when_not_cleared():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with observer(model, [opt]) as obs:
        rows0, _ = step(obs, model, [opt], 0, zero=False)  # .grad starts None
        rows1, facts = step(obs, model, [opt], 1, zero=False)
        rows2, facts2 = step(obs, model, [opt], 2, zero="zeros")  # zero_grad(set_to_none=False)
    for name in ("lin.weight", "lin.bias"):
        f, r = facts[name], rows1.loc[name]
        assert not rows0.loc[name].carried_grad and r.carried_grad
        assert r.grad_norm == pytest.approx(vnorm(f["grad1"] - f["grad0"]), rel=1e-5)
        assert r.grad_total_norm == pytest.approx(vnorm(f["grad1"]), rel=1e-6)
        assert r.grad_total_norm > r.grad_norm
        r2 = rows2.loc[name]  # landing on an all-zero .grad is not carrying
        assert not r2.carried_grad and r2.grad_total_norm == r2.grad_norm
        assert r2.grad_norm == pytest.approx(vnorm(facts2[name]["grad1"]), rel=1e-6)
    assert not rows1.loc["spare"].carried_grad


def test_accumulation_and_clipping_between_backward_and_step():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.lin.parameters())
    with observer(model, [opt]) as obs:
        def clip():
            model(X * 2).backward()  # a second micro-batch, then clipping
            grads[:] = clones([p.grad for p in params])
            nn.utils.clip_grad_norm_(params, 0.01)
        grads = []
        rows, facts = step(obs, model, [opt], 0, between=clip)
    for name, g in zip(("lin.weight", "lin.bias"), grads):
        r = rows.loc[name]
        assert r.grad_norm == pytest.approx(vnorm(g), rel=1e-6)  # both backwards, unclipped
        assert r.grad_total_norm < r.grad_norm and not r.carried_grad
    total = math.hypot(*(rows.loc[n].grad_total_norm for n in ("lin.weight", "lin.bias")))
    assert total == pytest.approx(0.01, rel=1e-4)


@STRATEGIES
def test_frozen_tensor_and_requires_grad_and_lr_at_step_time(loop):
    model = Net()
    model.lin.bias.requires_grad_(False)
    w, groups = model.lin.weight, [{"params": [model.lin.weight]},
                                   {"params": [model.lin.bias], "lr": 0.05}]
    opt = torch.optim.SGD(groups, lr=0.1)
    with observer(model, [opt], loop) as obs:
        rows, _ = step(obs, model, [opt], 0)
        b = rows.loc["lin.bias"]
        assert not b.requires_grad and not b.used and not b.changed and b.delta_norm == 0.0
        assert np.isnan(b.grad_norm) and b.update_ratio == 0.0
        assert (rows.loc["lin.weight"].lr, b.lr) == (0.1, 0.05) and np.isnan(rows.loc["spare"].lr)

        def between():
            w.requires_grad_(False)
            opt.param_groups[0]["lr"] = 0.2  # a scheduler's change before the step counts

        def after():
            w.requires_grad_(True)
            opt.param_groups[0]["lr"] = 99.0  # ... one after it does not
        rows, facts = step(obs, model, [opt], 1, between=between, after=after)
        r = rows.loc["lin.weight"]
        assert not r.requires_grad and r.used and r.lr == 0.2
        assert_change(r, facts["lin.weight"])
        assert step(obs, model, [opt], 2)[0].loc["lin.weight"].requires_grad
    assert not model.lin.bias.requires_grad  # attaching a hook left the flag as it was


@STRATEGIES
def test_nonfinite_gradient(loop):
    model = Toy()
    opt = torch.optim.SGD([model.w, model.v], lr=0.1)
    with observer(model, [opt], loop) as obs:
        for i, bad in enumerate([math.nan, math.inf, 1.0]):
            rows, facts = step(obs, model, [opt], i, x=torch.tensor([1.0, bad, 2.0]))
            w, v = rows.loc["w"], rows.loc["v"]
            assert w.used and w.nonfinite == (bad != 1.0) and not v.nonfinite
            if bad == 1.0:
                assert w.grad_norm == pytest.approx(math.sqrt(6))
            else:
                assert not math.isfinite(w.grad_norm)
            assert v.grad_norm == pytest.approx(vnorm(facts["v"]["grad1"]), rel=1e-6)


@STRATEGIES
def test_zero_and_tiny_gradients_are_exact(loop):
    model = Toy()
    opt = torch.optim.SGD([model.w, model.v], lr=0.1)
    with observer(model, [opt], loop) as obs:
        for i, scale in enumerate([0.0, 0.0, 1e-30, 0.0, 1e-30, 1e-30]):
            rows, _ = step(obs, model, [opt], i, x=torch.full((3,), scale))
            w = rows.loc["w"]
            assert w.used and not w.nonfinite
            assert w.grad_norm == pytest.approx(scale * math.sqrt(3), rel=1e-6)
            assert (w.grad_norm == 0) == (scale == 0)
            assert w.grad_total_norm == w.grad_norm


@STRATEGIES
def test_tensors_no_optimizer_holds_and_optimizer_only(loop):
    model, extra = Toy(), nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([model.w, extra], lr=0.1)
    with observer(model, [opt], loop) as obs:
        rows0, f0 = step(obs, model, [opt], 0)
        rows1, f1 = step(obs, model, [opt], 1)  # v.grad: nobody zeroes it
    for rows, f in ((rows0, f0["v"]), (rows1, f1["v"])):
        v = rows.loc["v"]
        assert v.used and v.requires_grad and np.isnan(v.lr)
        assert not v.changed and v.delta_norm == 0.0
        assert v.grad_total_norm == pytest.approx(vnorm(f["grad1"]), rel=1e-6)
    assert not rows0.loc["v"].carried_grad and rows1.loc["v"].carried_grad
    assert rows1.loc["v"].grad_norm == pytest.approx(vnorm(f1["v"]["grad1"] / 2), rel=1e-6)
    u, e = rows1.loc["u"], rows1.loc["<optimizer 0 group 0 #1>"]
    assert not u.used and np.isnan(u.lr) and not u.changed
    assert not e.used and e.lr == 0.1 and not e.changed and np.isnan(e.grad_total_norm)


@pytest.mark.parametrize("raises", [False, True], ids=["exits", "raises"])
@STRATEGIES
def test_exit_removes_every_hook(loop, raises):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="boom") if raises else contextlib.nullcontext():
        with observer(model, [opt], loop) as obs:
            assert obs.attached and opt._optimizer_step_pre_hooks
            step(obs, model, [opt], 0)
            if raises:
                obs.begin_step(1)
                model(X).backward()
                raise RuntimeError("boom")
    assert len(obs._handles) == 0 and not obs.attached and not obs.active
    assert all(not t._backward_hooks for t in obs.tensors)
    assert not opt._optimizer_step_pre_hooks
    table, used = obs.steps_table().copy(), obs.state.used.copy()
    model(X).backward()
    opt.step()
    pd.testing.assert_frame_equal(obs.steps_table(), table)  # only step 0, unchanged
    assert table["step"].unique().tolist() == [0]
    assert (obs.state.used == used).all() and not obs.state.touched
    obs.detach()  # again: harmless


def test_empty_steps_table_keeps_columns_and_dtypes():
    model = Net()
    table = observer(model, [torch.optim.SGD(model.parameters(), lr=0.1)]).steps_table()
    assert len(table) == 0 and list(table.columns) == list(STEPS_COLUMNS)
    assert table["used"].dtype == bool and table["grad_norm"].dtype == float


@STRATEGIES
def test_abort_step_drops_the_step(loop):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with observer(model, [opt], loop) as obs:
        step(obs, model, [opt], 0)
        obs.begin_step(1)
        opt.zero_grad(set_to_none=True)
        model(X).backward()
        opt.step()
        obs.abort_step()
        rows, facts = step(obs, model, [opt], 2)
    assert obs.steps_table()["step"].unique().tolist() == [0, 2]
    assert_change(rows.loc["lin.weight"], facts["lin.weight"])  # step 2's change only
    assert rows.loc["lin.weight"].grad_norm == pytest.approx(
        vnorm(facts["lin.weight"]["grad1"]), rel=1e-6)


def test_step_table_checksums_and_progress():
    model, events = Net(), []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    feed = lambda e, s, o: events.append((e, s))  # noqa: E731
    with observer(model, [opt], checksums=True, on_progress=feed) as obs:
        for i in (0, 5, 10):
            _, facts = step(obs, model, [opt], i)
    assert events[:3] == [("begin", 0), ("backward", 0), ("end", 0)] and len(events) == 9
    table = obs.steps_table()
    assert list(table.columns) == list(STEPS_COLUMNS) + ["checksum"]
    assert table["step"].tolist() == [0] * 3 + [5] * 3 + [10] * 3
    for i in (0, 5, 10):
        one = obs.step_table(i)
        pd.testing.assert_frame_equal(one, table[table.step == i].reset_index(drop=True))
    last = obs.step_table(10).set_index("name")["checksum"]
    for name, f in facts.items():
        assert last[name] == float(checksum(f["value1"]))


class Wide(nn.Module):
    """`big` spans more than one checksum chunk (the snapshot pass takes its checksum),
    `small` does not (taken apart)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.big = nn.Parameter(torch.randn(2, kernels.CHECKSUM_CHUNK // 2 + 7))
        self.small = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return (self.big * x[0, 0]).square().sum() + (self.small * x[1, 1]).sum()


def test_checksums_taken_in_the_snapshot_pass_are_the_values_own():
    model = Wide()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    with observer(model, [opt], checksums=True) as obs:
        for i in range(3):
            rows, facts = step(obs, model, [opt], i)
            assert set(obs.probe.checksums) == {obs.inv.names.index("big")}  # in passing
            for name, f in facts.items():
                assert rows.loc[name, "checksum"] == float(checksum(f["value1"])), (i, name)
                assert rows.loc[name, "checksum"] != float(checksum(f["value0"]))


def test_strategies_agree():
    tables = []
    for loop in (HOOKS, HOOKLESS):
        model = Net()
        model.lin.bias.requires_grad_(False)
        opt = torch.optim.SGD([model.lin.weight, model.lin.bias], lr=0.1)
        with observer(model, [opt], loop) as obs:
            for i in range(3):
                step(obs, model, [opt], i)
        tables.append(obs.steps_table())
    hooks, hookless = tables
    for col in ("requires_grad", "used", "changed", "carried_grad", "nonfinite"):
        assert hooks[col].tolist() == hookless[col].tolist(), col
    for col in ("grad_norm", "grad_total_norm", "delta_norm", "update_ratio", "lr"):
        np.testing.assert_allclose(hooks[col], hookless[col], rtol=1e-6, err_msg=col)
    assert hooks["name"].tolist()[:3] == ["spare", "lin.weight", "lin.bias"]
    assert hooks["used"].tolist() == [False, True, False] * 3


class WithLoose(nn.Module):
    """`loose` reaches the loss but is no parameter: an unregistered tensor, found by the walk."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 2)
        self.loose = torch.ones(2, requires_grad=True)

    def forward(self, x):
        return ((self.lin(x) * self.loose) ** 2).sum()


@pytest.mark.parametrize("checksums", [False, True])
def test_step_table_holds_the_unregistered_rows_of_that_step(checksums):
    """What a rank publishes per step (`step_columns`) is that step's rows of the whole table,
    the unregistered tensor's included, with the same dtypes."""
    model = WithLoose()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with observer(model, [opt], checksums=checksums) as obs:
        for i in (0, 3):
            step(obs, model, [opt], i)
    table = obs.steps_table()
    assert "loose" in set(table["name"])
    for i in (0, 3):
        pd.testing.assert_frame_equal(obs.step_table(i),
                                      table[table.step == i].reset_index(drop=True))
        assert obs.step_columns(i)["name"].tolist() == ["lin.weight", "lin.bias", "loose"]
