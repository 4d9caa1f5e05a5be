"""End-to-end zoo (optimizers): tiny, deliberately mis-wired models run through
`diagkit.diagnose` (tests/e2e/test_zoo.py says what each file of the zoo holds).

Who holds a tensor and who shares it: one tensor in several optimizers, several optimizers
each holding a part, tensors the optimizer holds outside the model, tied and reused weights.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

import diagkit
from diag_reads import OK, assert_verdicts, col, prow
from models import MLP, Reuse, TiedLM, fixed_batch, mse_loss


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
