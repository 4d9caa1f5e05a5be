"""Models whose parameters are not float32, under `watch` and `diagnose`, in every delta mode
(issue 21: a float64 model crashed `watch()` before training started, since the row norms
asked `vector_norm` to narrow doubles to float32).

A float64 model with an orphan (never trained) and a frozen-but-changing tensor (by 1e-12 a
step), plus an integer step counter and a complex scale held as parameters: every dtype is
observed and the verdicts are the same in every mode, in the user's own loop (`watch`) and
diagkit's (`diagnose`). A watch must never raise into the user's loop.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import diagkit

# The orphan's .grad is zeroed by no optimizer; the frozen float64 tensor and the integer
# counter change on every step without requiring grad; the complex scale trains.
EXPECTED = {"orphan.weight": {"orphan", "grad_not_cleared"},
            "orphan.bias": {"orphan", "grad_not_cleared"}, "frozen": {"frozen_but_changing"},
            "counter": {"frozen_but_changing"}, "scale": {"ok"}, "body.0.weight": {"ok"}}


class Double(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8)).double()
        self.orphan = nn.Linear(8, 1).double()
        self.frozen = nn.Parameter(torch.ones(3, dtype=torch.float64), requires_grad=False)
        self.counter = nn.Parameter(torch.zeros((), dtype=torch.int64), requires_grad=False)
        self.scale = nn.Parameter(torch.tensor([1 + 1j, 0.5j], dtype=torch.complex128))

    def forward(self, x):
        with torch.no_grad():
            self.frozen.add_(1e-12)  # changes though frozen
            self.counter.add_(1)  # changes every step too: an integer tensor measured
        y = self.orphan(self.body(x)).sum()
        return y + self.scale.abs().sum()


def setup():
    model = Double()
    trained = [p for n, p in model.named_parameters()
               if p.requires_grad and not n.startswith("orphan")]
    return model, torch.optim.SGD(trained, lr=0.01)


def verdicts(diag):
    got = diag.verdicts()
    return {name: got[name] for name in EXPECTED}


@pytest.mark.parametrize("delta", ["exact", "sampled", "off"])
def test_float64_model_under_watch(delta):
    model, opt = setup()
    x = torch.ones(4, 6, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing cast away (complex to real, say)
        w = diagkit.watch(model, opt, steps=3, delta=delta, sample=2)
        for _ in range(4):
            opt.zero_grad()
            model(x).backward()
            opt.step()
    diag = w.diagnosis
    assert diag is not None
    assert verdicts(diag) == EXPECTED
    steps = diag.steps[diag.steps["name"] == "body.0.weight"]
    assert steps["changed"].all() and len(steps) == 3
    if delta == "exact":
        assert (steps["delta_norm"] > 0).all()
        # Held by no optimizer and frozen: the frozen base, checked without a copy and read
        # when observing begins and ends, its change dated to the window's last step
        # (docs/cost.md, "When the frozen base is read"); the integer counter too.
        for name in ("frozen", "counter"):
            base = diag.steps[diag.steps["name"] == name]
            assert base["changed"].tolist() == [False, False, True], name
            assert base["delta_norm"].isna().all(), name


@pytest.mark.parametrize("delta", ["exact", "sampled", "off"])
def test_float64_model_under_diagnose(delta):
    model, opt = setup()
    x = torch.ones(4, 6, dtype=torch.float64)
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=lambda m, b: m(b),
                            steps=3, delta=delta, sample=2)
    assert verdicts(diag) == EXPECTED
