"""End-to-end zoo: tiny, deliberately mis-wired models run through `diagkit.diagnose`.

Every non-distributed verdict of SPEC section 3 is produced here by a real model and a real
training loop (no mocks, no hand-built tables). Each case asserts the exact verdict set of the
tensors it is about, that the innocent tensors stay {'ok'}, and the step-table columns that
explain the verdict (SPEC 2.3).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn

import diagkit
from diagkit.core.schema import PARAMS_COLUMNS, STEPS_COLUMNS
from models import (MLP, EvenBranch, MaskedHead, NormNet, Reuse, SqrtAtZero, TiedLM, WithDeadHead,
                    ZeroGate, fixed_batch, freeze_fc1_weight_at_step_2, mse_loss, sum_loss)

OK = {"ok"}
# The SPEC 2.2 minimum for each table.
SPEC_PARAMS_COLUMNS = ["name", "aliases", "module", "module_type", "shape", "numel", "bytes",
                       "dtype", "device", "requires_grad", "optimizer", "group", "lr",
                       "weight_decay", "used_steps", "steps", "grad_norm", "delta_norm",
                       "update_ratio", "verdicts"]
SPEC_STEPS_COLUMNS = ["step", "name", "requires_grad", "used", "grad_norm", "grad_total_norm",
                      "carried_grad", "delta_norm", "update_ratio", "changed", "lr", "nonfinite"]


# --------------------------------------------------------------------------- helpers


def col(diag, name, column):
    """One tensor's values of a steps column, in step order, as a numpy array."""
    s = diag.steps[diag.steps["name"] == name].sort_values("step")
    return s[column].to_numpy()


def prow(diag, name):
    rows = diag.params[diag.params["name"] == name]
    assert len(rows) == 1, f"expected one params row named {name!r}, got {len(rows)}"
    return rows.iloc[0]


def assert_verdicts(diag, expected: dict[str, set[str]]):
    """`expected` names every tensor row: exact verdict sets, nothing more, nothing less."""
    assert diag.verdicts() == expected


def codes(diag):
    return {f.code for f in diag.findings}


# --------------------------------------------------------------------------- clean
def test_clean_model_standard_loop_all_ok():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()
    calls = []

    def batch_fn(*args, **kwargs):
        assert not args and not kwargs  # SPEC 2.1: called with no arguments
        calls.append(1)
        return x

    steps = 4
    diag = diagkit.diagnose(model, opt, batch_fn=batch_fn, loss_fn=mse_loss, steps=steps)

    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert_verdicts(diag, {n: OK for n in names})
    assert len(calls) == steps  # exactly once per step
    assert diag.failure is None
    assert diag.findings == []
    assert diag.worst() is None
    assert diag.advice["find_unused_parameters"]["value"] is False

    st = diag.steps
    assert list(st.columns) == list(STEPS_COLUMNS)
    assert set(SPEC_STEPS_COLUMNS) <= set(st.columns)
    assert len(st) == steps * len(names)
    assert sorted(st["step"].unique().tolist()) == list(range(steps))
    per_step = st.groupby("step")["name"].apply(sorted).tolist()  # plain lists: any pandas
    assert per_step == [sorted(names)] * steps
    for c in ("requires_grad", "used", "changed"):
        assert st[c].all(), c
    assert not st["carried_grad"].any()
    assert not st["nonfinite"].any()
    assert (st["grad_norm"] > 0).all()
    # Nothing carried over: the step's own gradient is the whole .grad.
    np.testing.assert_allclose(st["grad_norm"], st["grad_total_norm"], rtol=1e-6)
    assert (st["lr"] == 0.05).all()
    # SGD: delta = lr * grad exactly in norm (up to float rounding).
    np.testing.assert_allclose(st["delta_norm"], 0.05 * st["grad_norm"], rtol=1e-4)
    assert (st["update_ratio"] > 0).all()

    p = diag.params
    assert list(p.columns) == list(PARAMS_COLUMNS)
    assert set(SPEC_PARAMS_COLUMNS) <= set(p.columns)
    assert list(p["name"]) == names
    assert (p["used_steps"] == steps).all() and (p["steps"] == steps).all()
    assert (p["verdicts"] == ("ok",)).all()
    assert (p["optimizer"] == 0).all() and (p["group"] == 0).all()
    assert tuple(prow(diag, "fc1.weight")["shape"]) == (5, 4)
    assert prow(diag, "fc1.weight")["numel"] == 20
    assert prow(diag, "fc1.weight")["bytes"] == 80
    assert prow(diag, "fc1.weight")["module"] == "fc1"
    assert prow(diag, "fc1.weight")["module_type"] == "Linear"


# --------------------------------------------------------------------------- orphan
def test_orphan_and_grad_not_cleared():
    """The seed report: a name filter keeps a tensor out of every optimizer group."""
    torch.manual_seed(0)
    model = MLP(d_out=3)
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("fc2.b")],
                          lr=0.01)
    x = fixed_batch(n=6)
    steps = 4
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=sum_loss, steps=steps)

    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK,
                           "fc2.bias": {"orphan", "grad_not_cleared"}})
    # d(sum of outputs)/d(output bias) = batch size per element, whatever the weights: the
    # step's own gradient is constant, while the .grad nobody zeroes grows linearly.
    fresh = 6 * math.sqrt(3)
    np.testing.assert_allclose(col(diag, "fc2.bias", "grad_norm"), [fresh] * steps, rtol=1e-6)
    np.testing.assert_allclose(col(diag, "fc2.bias", "grad_total_norm"),
                               [fresh * (k + 1) for k in range(steps)], rtol=1e-6)
    assert (np.diff(col(diag, "fc2.bias", "grad_total_norm")) > 0).all()
    assert col(diag, "fc2.bias", "carried_grad").tolist() == [False] + [True] * (steps - 1)
    assert col(diag, "fc2.bias", "used").all()
    assert not col(diag, "fc2.bias", "changed").any()
    assert (col(diag, "fc2.bias", "delta_norm") == 0).all()
    assert np.isnan(col(diag, "fc2.bias", "lr")).all()
    row = prow(diag, "fc2.bias")
    assert pd.isna(row["optimizer"]) and pd.isna(row["group"])
    assert row["used_steps"] == steps
    # The optimized tensors are cleared every step: never carried.
    assert not col(diag, "fc2.weight", "carried_grad").any()
    assert {"orphan", "grad_not_cleared"} <= codes(diag)
    orphan = next(f for f in diag.findings if f.code == "orphan")
    assert orphan.severity == "error" and orphan.params == ("fc2.bias",)


# --------------------------------------------------------------------------- unused / intermittent


def test_unused_submodule():
    torch.manual_seed(0)
    model = WithDeadHead()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3)

    assert_verdicts(diag, {"body.weight": OK, "body.bias": OK,
                           "dead.weight": {"unused"}, "dead.bias": {"unused"}})
    for n in ("dead.weight", "dead.bias"):
        assert not col(diag, n, "used").any()
        assert col(diag, n, "requires_grad").all()
        assert np.isnan(col(diag, n, "grad_norm")).all()
        assert np.isnan(col(diag, n, "grad_total_norm")).all()
        assert not col(diag, n, "changed").any()
        assert prow(diag, n)["used_steps"] == 0
    unused = [f for f in diag.findings if f.code == "unused"]
    assert len(unused) == 1 and unused[0].module == "dead" and unused[0].count == 2
    assert unused[0].severity == "warning"
    assert diag.advice["find_unused_parameters"]["value"] is True


def test_intermittent_branch_via_train_step():
    torch.manual_seed(0)
    model = EvenBranch()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()

    def train_step(i):
        opt.zero_grad()
        loss = model(x, use_extra=(i % 2 == 0)).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=4)
    assert_verdicts(diag, {"trunk.weight": OK, "trunk.bias": OK,
                           "extra.weight": {"intermittent"}, "extra.bias": {"intermittent"}})
    for n in ("extra.weight", "extra.bias"):
        assert col(diag, n, "used").tolist() == [True, False, True, False]
        assert col(diag, n, "changed").tolist() == [True, False, True, False]
        g = col(diag, n, "grad_norm")
        assert (g[[0, 2]] > 0).all() and np.isnan(g[[1, 3]]).all()
        assert prow(diag, n)["used_steps"] == 2
    assert col(diag, "trunk.weight", "used").all()
    assert diag.advice["find_unused_parameters"]["value"] is True
    assert diag.meta["loop"] == "train_step"


def test_intermittent_branch_via_batch_counter_standard_loop():
    """Same case in the standard loop: the batch itself says which branch runs."""
    torch.manual_seed(0)
    model = EvenBranch()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()
    counter = {"n": 0}

    def batch_fn():
        counter["n"] += 1
        return x, counter["n"] % 3 == 1  # batches 1 and 4 (steps 0 and 3) take the branch

    diag = diagkit.diagnose(model, opt, batch_fn=batch_fn,
                            loss_fn=lambda m, b: m(b[0], use_extra=b[1]).sum(), steps=4)
    assert_verdicts(diag, {"trunk.weight": OK, "trunk.bias": OK,
                           "extra.weight": {"intermittent"}, "extra.bias": {"intermittent"}})
    assert col(diag, "extra.bias", "used").tolist() == [True, False, False, True]


# --------------------------------------------------------------------------- frozen
def test_frozen_in_optimizer():
    torch.manual_seed(0)
    model = MLP()
    model.fc1.weight.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)  # still holds fc1.weight
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3)

    assert_verdicts(diag, {"fc1.weight": {"frozen_in_optimizer"}, "fc1.bias": OK,
                           "fc2.weight": OK, "fc2.bias": OK})
    assert not col(diag, "fc1.weight", "requires_grad").any()
    assert not col(diag, "fc1.weight", "used").any()
    assert not col(diag, "fc1.weight", "changed").any()
    assert not prow(diag, "fc1.weight")["requires_grad"]
    assert prow(diag, "fc1.weight")["optimizer"] == 0


def test_frozen_from_start_not_in_optimizer_is_ok():
    """Frozen and left out of the optimizer: the correct way to freeze, so not 'unused'."""
    torch.manual_seed(0)
    model = MLP()
    for p in model.fc1.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3)

    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK})
    for n in ("fc1.weight", "fc1.bias"):
        assert not col(diag, n, "requires_grad").any()
        assert not col(diag, n, "used").any()
        assert not col(diag, n, "changed").any()
        assert prow(diag, n)["used_steps"] == 0
    assert col(diag, "fc2.weight", "used").all()
    assert diag.advice["find_unused_parameters"]["value"] is False


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01),
], ids=["sgd_momentum", "adam"])
def test_frozen_but_changing_mid_run_freeze(make_opt):
    """Freezing at step 2 without set_to_none: the zeroed .grad stays, momentum moves it."""
    torch.manual_seed(0)
    model = MLP()
    opt = make_opt(model.parameters())
    train_step = freeze_fc1_weight_at_step_2(model, opt, fixed_batch())
    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=4)
    assert_verdicts(diag, {"fc1.weight": {"frozen_but_changing", "frozen_in_optimizer"},
                           "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK})
    n = "fc1.weight"
    assert col(diag, n, "requires_grad").tolist() == [True, True, False, False]
    assert col(diag, n, "used").tolist() == [True, True, False, False]
    assert col(diag, n, "changed").tolist() == [True, True, True, True]
    assert (col(diag, n, "delta_norm")[2:] > 0).all()
    # The .grad the optimizer sees on the frozen steps is the zeroed one, not a carried value.
    np.testing.assert_array_equal(col(diag, n, "grad_total_norm")[2:], [0.0, 0.0])
    assert not col(diag, n, "carried_grad").any()
    assert not prow(diag, n)["requires_grad"]
    f = next(f for f in diag.findings if f.code == "frozen_but_changing")
    assert f.severity == "error" and f.params == (n,)


# --------------------------------------------------------------------------- stalled / zero
def test_stalled_lr_zero_group():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD([{"params": model.fc1.parameters(), "lr": 0.0},
                           {"params": model.fc2.parameters()}], lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3)

    assert_verdicts(diag, {"fc1.weight": {"stalled"}, "fc1.bias": {"stalled"},
                           "fc2.weight": OK, "fc2.bias": OK})
    for n in ("fc1.weight", "fc1.bias"):
        assert col(diag, n, "used").all()
        assert (col(diag, n, "grad_norm") > 0).all()
        assert not col(diag, n, "changed").any()
        assert (col(diag, n, "lr") == 0.0).all()
        assert prow(diag, n)["lr"] == 0.0 and prow(diag, n)["group"] == 0
    assert (col(diag, "fc2.weight", "lr") == 0.05).all()
    assert prow(diag, "fc2.weight")["group"] == 1
    assert col(diag, "fc2.weight", "changed").all()


def test_zero_gradient_plain_sgd_is_also_stalled():
    torch.manual_seed(0)
    model = ZeroGate()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3)
    # A zero gradient through plain SGD never moves the value: both verdicts apply.
    assert_verdicts(diag, {"fc.weight": OK, "fc.bias": OK,
                           "gate": {"zero_gradient", "stalled"}})
    assert col(diag, "gate", "used").all()
    np.testing.assert_array_equal(col(diag, "gate", "grad_norm"), [0.0] * 3)
    assert not col(diag, "gate", "changed").any()


def test_zero_gradient_alone_when_weight_decay_moves_it():
    torch.manual_seed(0)
    model = ZeroGate()
    opt = torch.optim.SGD([{"params": [model.fc.weight, model.fc.bias]},
                           {"params": [model.gate], "weight_decay": 0.1}], lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3)
    assert_verdicts(diag, {"fc.weight": OK, "fc.bias": OK, "gate": {"zero_gradient"}})
    np.testing.assert_array_equal(col(diag, "gate", "grad_norm"), [0.0] * 3)
    assert col(diag, "gate", "changed").all()  # decay shrinks it


# --------------------------------------------------------------------------- nonfinite


def test_nonfinite_grad():
    torch.manual_seed(0)
    model = SqrtAtZero()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=lambda m, b: m(b), steps=3)

    assert_verdicts(diag, {"fc.weight": OK, "fc.bias": OK, "s": {"nonfinite_grad"}})
    assert col(diag, "s", "nonfinite").all()
    assert col(diag, "s", "grad_norm")[0] == math.inf
    assert col(diag, "s", "used").all()
    for n in ("fc.weight", "fc.bias"):
        assert not col(diag, n, "nonfinite").any()
        assert np.isfinite(col(diag, n, "grad_norm")).all()
    assert prow(diag, "s")["nonfinite_steps"] == 3
    f = next(f for f in diag.findings if f.code == "nonfinite_grad")
    assert f.severity == "error"


def test_nonfinite_grad_one_step_only():
    """Inf on step 0 only (the branch is then switched off): one bad step is enough, and
    `nonfinite` is about the step's fresh gradient, not the inf .grad still held later."""
    torch.manual_seed(0)
    model = SqrtAtZero()
    opt = torch.optim.SGD(model.fc.parameters(), lr=0.05)  # `s` is left out: its .grad stays
    x = fixed_batch()

    def train_step(i):
        opt.zero_grad()
        loss = model.fc(x).pow(2).mean()
        if i == 0:
            loss = loss + torch.sqrt(model.s - model.s.detach()).sum()
        loss.backward()
        opt.step()
        return loss

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    assert_verdicts(diag, {"fc.weight": OK, "fc.bias": OK,
                           "s": {"nonfinite_grad", "intermittent", "orphan"}})
    assert col(diag, "s", "nonfinite").tolist() == [True, False, False]
    assert col(diag, "s", "used").tolist() == [True, False, False]
    assert (col(diag, "s", "grad_total_norm") == math.inf).all()
    assert prow(diag, "s")["nonfinite_steps"] == 1


# --------------------------------------------------------------------------- decay


def test_decay_on_norm_or_bias_adamw_everything():
    torch.manual_seed(0)
    model = NormNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=2)

    flagged = {"decay_on_norm_or_bias"}
    assert_verdicts(diag, {"fc.weight": OK, "fc.bias": flagged, "ln.weight": flagged,
                           "ln.bias": flagged, "out.weight": OK})
    assert (diag.params["weight_decay"] == 0.05).all()
    assert prow(diag, "ln.weight")["module_type"] == "LayerNorm"
    f = [f for f in diag.findings if f.code == "decay_on_norm_or_bias"]
    assert f and all(x.severity == "info" for x in f)
    assert {n for x in f for n in x.params} == {"fc.bias", "ln.weight", "ln.bias"}


def test_decay_split_correctly_is_ok():
    torch.manual_seed(0)
    model = NormNet()
    no_decay = [model.fc.bias, model.ln.weight, model.ln.bias]
    decay = [model.fc.weight, model.out.weight]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-2)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=2)
    assert_verdicts(diag, {n: OK for n in ("fc.weight", "fc.bias", "ln.weight", "ln.bias",
                                           "out.weight")})
    assert prow(diag, "ln.weight")["weight_decay"] == 0.0
    assert prow(diag, "fc.weight")["weight_decay"] == 0.05


# --------------------------------------------------------------------------- optimizers
def test_in_multiple_optimizers():
    torch.manual_seed(0)
    model = MLP()
    opt_a = torch.optim.SGD(model.parameters(), lr=0.05)
    opt_b = torch.optim.SGD([model.fc2.weight], lr=0.01)  # fc2.weight again: stepped twice
    x = fixed_batch()
    diag = diagkit.diagnose(model, [opt_a, opt_b], batch_fn=lambda: x, loss_fn=mse_loss,
                            steps=3)
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK,
                           "fc2.weight": {"in_multiple_optimizers"}, "fc2.bias": OK})
    row = prow(diag, "fc2.weight")
    assert row["n_optimizers"] == 2
    assert tuple(row["memberships"]) == ((0, 0), (1, 0))
    assert row["optimizer"] == 0
    assert (col(diag, "fc2.weight", "lr") == 0.05).all()  # lr of its first group
    # Stepped by both: the change is (0.05 + 0.01) * grad in norm.
    np.testing.assert_allclose(col(diag, "fc2.weight", "delta_norm"),
                               0.06 * col(diag, "fc2.weight", "grad_norm"), rtol=1e-4)
    assert next(f for f in diag.findings
                if f.code == "in_multiple_optimizers").severity == "error"


def test_several_optimizers_each_holding_part_all_ok():
    torch.manual_seed(0)
    model = MLP()
    opt_a = torch.optim.SGD(model.fc1.parameters(), lr=0.05)
    opt_b = torch.optim.Adam(model.fc2.parameters(), lr=0.01)
    x = fixed_batch()
    diag = diagkit.diagnose(model, [opt_a, opt_b], batch_fn=lambda: x, loss_fn=mse_loss,
                            steps=3)
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK})
    assert prow(diag, "fc1.weight")["optimizer"] == 0
    assert prow(diag, "fc2.weight")["optimizer"] == 1
    assert (col(diag, "fc1.bias", "lr") == 0.05).all()
    assert (col(diag, "fc2.bias", "lr") == 0.01).all()
    assert diag.steps["changed"].all() and diag.steps["used"].all()
    assert not diag.steps["carried_grad"].any()  # each optimizer zeroes its own part


def test_not_in_model_tensor_used_in_loss():
    """A forward-argument tensor: trained by the optimizer, invisible to model.zero_grad/DDP."""
    torch.manual_seed(0)
    model = MLP()
    temperature = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD(list(model.parameters()) + [temperature], lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x,
                            loss_fn=lambda m, b: (m(b) * temperature).pow(2).mean(), steps=3)
    name = "<optimizer 0 group 0 #4>"
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK,
                           name: {"not_in_model"}})
    row = prow(diag, name)
    assert not row["in_model"]
    assert tuple(row["shape"]) == (3,)
    assert col(diag, name, "used").all() and col(diag, name, "changed").all()
    assert diag.params["name"].tolist()[-1] == name  # model tensors first


def test_not_in_model_stale_head_is_also_unused():
    torch.manual_seed(0)
    model = MLP()
    old_head = nn.Linear(3, 2)  # replaced in the model, still in the optimizer
    opt = torch.optim.SGD([{"params": model.parameters()},
                           {"params": old_head.parameters(), "lr": 0.1}], lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=2)
    stale = {"not_in_model", "unused"}
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK,
                           "<optimizer 0 group 1 #0>": stale,
                           "<optimizer 0 group 1 #1>": stale})
    assert (col(diag, "<optimizer 0 group 1 #0>", "lr") == 0.1).all()


# --------------------------------------------------------------------------- sharing


def test_tied_weights_one_row_with_alias():
    torch.manual_seed(0)
    model = TiedLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    targets = torch.tensor([[2, 3, 4], [5, 6, 0]])

    def loss_fn(m, batch):
        t, y = batch
        return nn.functional.cross_entropy(m(t).reshape(-1, 7), y.reshape(-1))

    diag = diagkit.diagnose(model, opt, batch_fn=lambda: (tokens, targets), loss_fn=loss_fn,
                            steps=3)
    assert_verdicts(diag, {"emb.weight": OK, "mix.weight": OK, "mix.bias": OK})
    row = prow(diag, "emb.weight")
    assert tuple(row["aliases"]) == ("head.weight",)
    assert "head.weight" not in set(diag.steps["name"])
    assert len(diag.steps) == 3 * 3
    assert col(diag, "emb.weight", "used").all()
    assert not col(diag, "emb.weight", "carried_grad").any()
    # Its gradient is the sum of the embedding use and the head use.
    model.zero_grad(set_to_none=True)  # restored model: same values as step 0
    loss_fn(model, (tokens, targets)).backward()
    np.testing.assert_allclose(col(diag, "emb.weight", "grad_norm")[0],
                               model.emb.weight.grad.norm().item(), rtol=1e-5)


def test_module_reused_twice_accumulates_both_uses():
    torch.manual_seed(0)
    model = Reuse()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3)
    assert_verdicts(diag, {"block.weight": OK, "block.bias": OK, "out.weight": OK,
                           "out.bias": OK})
    assert col(diag, "block.weight", "used").all()
    assert not col(diag, "block.weight", "carried_grad").any()

    # Independent: the gradient from both uses, on a copy with the same (restored) values.
    w = model.block.weight.detach().clone().requires_grad_(True)
    b = model.block.bias.detach().clone().requires_grad_(True)
    h = torch.tanh(x @ w.T + b)
    y = model.out(h @ w.T + b)
    gw, gb = torch.autograd.grad(y.pow(2).mean(), [w, b])
    np.testing.assert_allclose(col(diag, "block.weight", "grad_norm")[0], gw.norm().item(),
                               rtol=1e-5)
    np.testing.assert_allclose(col(diag, "block.bias", "grad_norm")[0], gb.norm().item(),
                               rtol=1e-5)
    # ...and not the gradient of the outer use alone (first use detached).
    h_detached = torch.tanh(x @ w.T + b).detach()
    outer_only = torch.autograd.grad(model.out(h_detached @ w.T + b).pow(2).mean(), [w])[0]
    assert not math.isclose(col(diag, "block.weight", "grad_norm")[0],
                            outer_only.norm().item(), rel_tol=1e-3)


# --------------------------------------------------------------------------- user loops
def test_gradient_accumulation_in_train_step():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    micro = [[torch.randn(3, 4, generator=g) for _ in range(2)] for _ in range(3)]

    def train_step(i):
        opt.zero_grad()
        total = 0.0
        for xb in micro[i]:
            loss = model(xb).pow(2).mean() / 2
            loss.backward()
            total += loss.detach()
        opt.step()
        return total

    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    assert_verdicts(diag, {n: OK for n in snapshot})
    assert not diag.steps["carried_grad"].any()  # the 2nd micro-batch landing is not a carry
    assert diag.steps["used"].all()

    # Expected step-0 gradient: sum over both micro-batches, computed by hand on a copy.
    params = {n: v.clone().requires_grad_(True) for n, v in snapshot.items()}

    def f(xb):
        h = torch.relu(xb @ params["fc1.weight"].T + params["fc1.bias"])
        return (h @ params["fc2.weight"].T + params["fc2.bias"]).pow(2).mean() / 2

    loss = f(micro[0][0]) + f(micro[0][1])
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    single = dict(zip(params, torch.autograd.grad(f(micro[0][1]), list(params.values()))))
    for n, gr in grads.items():
        got = col(diag, n, "grad_norm")[0]
        np.testing.assert_allclose(got, gr.norm().item(), rtol=1e-5)
        np.testing.assert_allclose(col(diag, n, "grad_total_norm")[0], gr.norm().item(),
                                   rtol=1e-5)
        assert not math.isclose(got, single[n].norm().item(), rel_tol=1e-4)


def test_gradient_accumulation_without_set_to_none():
    """Accumulating onto zeroed (not None) .grads: still the summed fresh gradient, no carry."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs = [fixed_batch(n=3, seed=s) for s in (5, 6)]

    def train_step(i):
        opt.zero_grad(set_to_none=False)
        for xb in xs:
            model(xb).pow(2).mean().backward()
        opt.step()

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    assert_verdicts(diag, {n: OK for n, _ in model.named_parameters()})
    assert not diag.steps["carried_grad"].any()
    np.testing.assert_allclose(diag.steps["grad_norm"], diag.steps["grad_total_norm"],
                               rtol=1e-5)


def test_zero_grad_set_to_false_standard_loop_stays_ok():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=4,
                            zero_grad_set_to_none=False)
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK})
    assert not diag.steps["carried_grad"].any()  # zeros are not a carried gradient
    np.testing.assert_allclose(diag.steps["grad_norm"], diag.steps["grad_total_norm"],
                               rtol=1e-6)


def test_lr_scheduler_lr_column_follows_schedule():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.08)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=4,
                            lr_scheduler=sched)
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK})
    expected = [0.08, 0.04, 0.02, 0.01]
    for n in ("fc1.weight", "fc2.bias"):
        np.testing.assert_allclose(col(diag, n, "lr"), expected, rtol=1e-12)
        # SGD: each step's change is that step's lr times its gradient.
        np.testing.assert_allclose(col(diag, n, "delta_norm"),
                                   np.array(expected) * col(diag, n, "grad_norm"), rtol=1e-4)
    assert prow(diag, "fc1.weight")["lr"] == pytest.approx(0.01)  # the last step's lr


def test_lambda_lr_warmup_from_zero_is_not_stalled():
    """Warm-up starting at lr 0 leaves step 0 unchanged, but later steps move: not stalled."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: k / 2)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=mse_loss, steps=3,
                            lr_scheduler=sched)
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK})
    np.testing.assert_allclose(col(diag, "fc1.weight", "lr"), [0.0, 0.05, 0.1])
    assert col(diag, "fc1.weight", "changed").tolist() == [False, True, True]


# --------------------------------------------------------------------------- failure
def test_failing_train_step_keeps_earlier_steps():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()

    def train_step(i):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        if i == 2:
            raise ValueError("data loader exploded")
        opt.step()
        return loss

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=5)
    assert diag.failure is not None
    assert diag.failure.step == 2
    assert "ValueError" in diag.failure.error and "data loader exploded" in diag.failure.error
    assert "data loader exploded" in diag.failure.traceback
    assert sorted(diag.steps["step"].unique().tolist()) == [0, 1]
    assert len(diag.steps) == 2 * 4
    assert (diag.params["steps"] == 2).all()
    failed = [f for f in diag.findings if f.code == "step_failed"]
    assert len(failed) == 1 and failed[0].severity == "error"
    assert diag.worst() == "error"
    # The two completed steps are still judged: a clean model.
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK, "fc2.bias": OK})
    assert diag.meta["steps_observed"] == 2 and diag.meta["steps_requested"] == 5


def test_failing_on_first_step_still_returns_diagnosis():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def train_step(i):
        raise RuntimeError("broken from the start")

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    assert diag.failure is not None and diag.failure.step == 0
    assert len(diag.steps) == 0
    assert list(diag.steps.columns) == list(STEPS_COLUMNS)
    assert len(diag.params) == 4
    assert "step_failed" in codes(diag)


def test_orphan_cleared_by_model_zero_grad_is_only_orphan():
    """A user loop that zeroes through the model clears the orphan too: no carried gradient."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD([model.fc1.weight, model.fc1.bias, model.fc2.weight], lr=0.01)
    x = fixed_batch()

    def train_step(i):
        model.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    assert_verdicts(diag, {"fc1.weight": OK, "fc1.bias": OK, "fc2.weight": OK,
                           "fc2.bias": {"orphan"}})
    assert not col(diag, "fc2.bias", "carried_grad").any()
    np.testing.assert_allclose(col(diag, "fc2.bias", "grad_total_norm"),
                               [6 * math.sqrt(3)] * 3, rtol=1e-6)


# --------------------------------------------------------------------------- known bugs


def test_frozen_tensor_holding_inf_is_not_changing():
    torch.manual_seed(0)
    model = MaskedHead()
    opt = torch.optim.SGD(model.fc.parameters(), lr=0.05)
    x = fixed_batch()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x,
                            loss_fn=lambda m, b: m(b)[:, 0].sum(), steps=2)
    assert not col(diag, "mask", "changed").any()  # -inf == -inf: exact comparison
    assert_verdicts(diag, {"fc.weight": OK, "fc.bias": OK, "mask": OK})


def test_gan_style_two_optimizers_stepped_in_sequence():
    torch.manual_seed(0)
    model = nn.ModuleDict({"G": nn.Linear(4, 4), "D": nn.Linear(4, 1, bias=False)})
    G, D = model["G"], model["D"]
    opt_d = torch.optim.SGD(D.parameters(), lr=0.05)
    opt_g = torch.optim.SGD(G.parameters(), lr=0.05)
    for p in model.parameters():  # grads exist, as after any earlier training
        p.grad = torch.zeros_like(p)
    x = fixed_batch()

    def train_step(i):
        opt_d.zero_grad(set_to_none=False)
        opt_g.zero_grad(set_to_none=False)
        fake = G(x)
        (D(fake.detach()).mean() - D(x).mean()).backward()
        opt_d.step()
        opt_d.zero_grad(set_to_none=False)
        (-D(fake).mean()).backward()
        opt_g.step()

    diag = diagkit.diagnose(model, [opt_d, opt_g], train_step=train_step, steps=2)
    # Independent: replay step 0 by hand on the restored model; the generator's gradient flows
    # through D as updated by opt_d.step(), so it is read after that step.
    fake = G(x)
    opt_d.zero_grad(set_to_none=False)
    (D(fake.detach()).mean() - D(x).mean()).backward()
    with torch.no_grad():
        d_after = D.weight - 0.05 * D.weight.grad
    gw = torch.autograd.grad(-(fake @ d_after.T).mean(), [G.weight])[0]
    assert col(diag, "G.weight", "used").all()
    np.testing.assert_allclose(col(diag, "G.weight", "grad_norm")[0], gw.norm().item(),
                               rtol=1e-5)
    assert_verdicts(diag, {"G.weight": OK, "G.bias": OK, "D.weight": OK})


def test_grad_norm_is_the_produced_gradient_under_clipping():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = fixed_batch()
    max_norm = 1e-3

    def train_step(i):
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).sum()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        return loss

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=1)
    # The .grad the optimizer sees is clipped ...
    total = np.sqrt((diag.steps["grad_total_norm"] ** 2).sum())
    np.testing.assert_allclose(total, max_norm, rtol=1e-3)
    # ... but the gradient produced by backward is not (computed on the restored model).
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    np.testing.assert_allclose(col(diag, "fc1.weight", "grad_norm")[0],
                               model.fc1.weight.grad.norm().item(), rtol=1e-5)
