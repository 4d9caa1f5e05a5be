"""End-to-end zoo (loops): tiny, deliberately mis-wired models run through
`diagkit.diagnose` (tests/e2e/test_zoo.py says what each file of the zoo holds).

The user's own loops (gradient accumulation, zero_grad without set_to_none, learning-rate
schedules), a step that fails, and known traps (an inf that never changes, two optimizers
stepped in sequence, clipping).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import diagkit
from diag_reads import OK, assert_verdicts, codes, col, prow
from diagkit.core.schema import STEPS_COLUMNS
from models import MLP, MaskedHead, fixed_batch, mse_loss


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
