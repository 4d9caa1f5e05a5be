"""End-to-end zoo: tiny, deliberately mis-wired models run through `diagkit.diagnose`.

Every non-distributed verdict of SPEC section 3 is produced by a real model and a real
training loop (no mocks, no hand-built tables). Each case asserts the exact verdict set of the
tensors it is about, that the innocent tensors stay {'ok'}, and the step-table columns that
explain the verdict (SPEC 2.3). By concern: this file, a clean run, the tensors left out of the
optimizer or of the forward, and frozen ones; test_zoo_updates.py, tensors that do not move or
go bad (stalled, zero gradient, nonfinite, decay); test_zoo_optimizers.py, who holds a tensor
and who shares it (several optimizers, tensors outside the model, tied and reused weights);
test_zoo_loops.py, the user's own loops, failing steps and known traps. What they read off a
diagnosis is tests/helpers/diag_reads.py.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import diagkit
from diag_reads import OK, assert_verdicts, codes, col, prow
from diagkit.core.schema import PARAMS_COLUMNS, STEPS_COLUMNS
from models import (MLP, EvenBranch, WithDeadHead, fixed_batch, freeze_fc1_weight_at_step_2,
                    mse_loss, sum_loss)

# The SPEC 2.2 minimum for each table.
SPEC_PARAMS_COLUMNS = ["name", "aliases", "module", "module_type", "shape", "numel", "bytes",
                       "dtype", "device", "requires_grad", "optimizer", "group", "lr",
                       "weight_decay", "used_steps", "steps", "grad_norm", "delta_norm",
                       "update_ratio", "verdicts"]
SPEC_STEPS_COLUMNS = ["step", "name", "requires_grad", "used", "grad_norm", "grad_total_norm",
                      "carried_grad", "delta_norm", "update_ratio", "changed", "lr", "nonfinite"]


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
