"""One way of measuring on its own (issue 6): the sampled estimate of a dense update is near
the truth, every=k observes only those steps, bad options are one-line errors, and the kernels:
the fingerprint sees any one element change, and changes and gradients below float32's range
still count. The modes compared on whole scenarios are test_modes.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import diagkit
from diagkit.measure.change.fingerprint import Fingerprinter
from mode_scenarios import orphan, run


def test_sampled_estimate_is_close_on_a_dense_update():
    """A dense update (every element moves): the sample's norm, scaled, is near the truth."""
    def build():
        torch.manual_seed(0)
        model = nn.Linear(64, 64)
        x = torch.randn(32, 64)
        return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                    batch_fn=lambda: x, loss_fn=lambda m, b: m(b).pow(2).mean(), steps=2)
    exact = run(build).steps.set_index(["step", "name"])["delta_norm"]
    sampled = run(build, delta="sampled", sample=1024).steps.set_index(["step", "name"])
    ratio = sampled["delta_norm"] / exact
    assert ((ratio > 0.8) & (ratio < 1.25)).all(), ratio


def test_every_k_observes_only_those_steps():
    def build():
        return orphan() | {"steps": 7}
    full = run(build)
    strided = run(build, every=3)
    assert sorted(strided.steps["step"].unique()) == [0, 3, 6]
    assert strided.meta["every"] == 3 and strided.meta["steps_observed"] == 3
    assert strided.verdicts() == full.verdicts()
    keep = full.steps[full.steps["step"].isin([0, 3, 6])].reset_index(drop=True)
    for column in ("used", "changed", "grad_norm", "delta_norm", "grad_total_norm"):
        np.testing.assert_array_equal(keep[column].to_numpy(),
                                      strided.steps[column].to_numpy(), err_msg=column)


def test_bad_mode_and_stride_are_one_line_errors():
    kwargs = orphan()
    model = kwargs.pop("model")
    for bad, message in ((dict(delta="fast"), "delta must be one of"),
                         (dict(every=0), "every must be a positive int"),
                         (dict(delta="sampled", sample=0), "sample must be a positive int")):
        with pytest.raises(diagkit.DiagkitError, match=message):
            diagkit.diagnose(model, **kwargs, **bad)


# ------------------------------------------------------------------ kernels
def test_fingerprint_sees_any_single_element_change_and_nothing_else():
    fp = Fingerprinter()
    fp.CHUNK = 64  # several chunks on a small tensor
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float64: torch.int64, torch.int64: torch.int64}
    for dtype, as_int in bits.items():
        t = (torch.randn(10, 30) * 100).to(dtype)
        base = [int(v) for v in fp(t)]
        assert [int(v) for v in fp(t.clone())] == base
        for pos in (0, 77, 299):
            for step in (1, -1, 1 << 10):  # the smallest change of one element, and others
                u = t.clone()
                u.view(as_int).view(-1)[pos] += step
                assert [int(v) for v in fp(u)] != base, (dtype, pos, step)
        swapped = t.clone().reshape(-1)
        swapped[[3, 200]] = swapped[[200, 3]]
        if not torch.equal(swapped, t.reshape(-1)):
            assert [int(v) for v in fp(swapped.reshape(10, 30))] != base  # position matters


def test_tiny_changes_below_float32_underflow_still_count():
    """A change of 1e-30 squares to 0 in float32: exact mode must still see it."""
    model = nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    x = torch.zeros(2, 3)

    def train_step(i):
        with torch.no_grad():
            model.weight[0, 1] += 1e-30
        return model(x).sum()
    diag = diagkit.diagnose(model, torch.optim.SGD(model.parameters(), lr=0.0),
                            train_step=train_step, steps=2)
    changed = diag.steps["changed"].tolist()
    assert changed == [True, True]
    np.testing.assert_allclose(diag.steps["delta_norm"], 1e-30, rtol=1e-6)


def test_tiny_gradient_is_not_reported_as_zero():
    w = nn.Parameter(torch.ones(4))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = w

        def forward(self, x):
            return (self.w * 1e-30).sum()
    model = Tiny()
    diag = diagkit.diagnose(model, torch.optim.SGD(model.parameters(), lr=0.1),
                            batch_fn=lambda: None, loss_fn=lambda m, b: m(b), steps=2)
    np.testing.assert_allclose(diag.steps["grad_norm"], 2e-30, rtol=1e-6)
    assert "zero_gradient" not in diag.verdicts()["w"]
