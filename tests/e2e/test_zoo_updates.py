"""End-to-end zoo (updates): tiny, deliberately mis-wired models run through
`diagkit.diagnose` (tests/e2e/test_zoo.py says what each file of the zoo holds).

Tensors whose updates do not happen or go bad: a zero learning rate, a zero gradient, a
nonfinite gradient, weight decay on norms and biases.
"""

from __future__ import annotations

import math

import numpy as np
import torch

import diagkit
from diag_reads import OK, assert_verdicts, col, prow
from models import MLP, NormNet, SqrtAtZero, ZeroGate, fixed_batch, mse_loss


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
