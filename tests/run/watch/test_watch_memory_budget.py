"""`watch(memory_budget=...)`: checked as watch's other options (a one-line DiagkitError, also
from the callbacks), passed to the probe, and the tensors it moved to the fingerprint are named
in the result (`meta["over_budget"]`). The CUDA device is faked on the CPU, as in
tests/measure/change/test_split_probe.py."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import diagkit
from diagkit.core.errors import DiagkitError
from diagkit.measure.change import split_probe


def train(model, opt, n):
    for _ in range(n):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "half"])
def test_a_bad_budget_is_one_line(bad):
    model = nn.Linear(8, 2)
    with pytest.raises(DiagkitError, match="memory_budget must be a fraction"):
        diagkit.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), memory_budget=bad)


def test_the_budget_reaches_the_probe_and_the_result_names_what_it_moved(monkeypatch, caplog):
    monkeypatch.setattr(split_probe, "budgeted", lambda t: True)
    monkeypatch.setattr(split_probe, "free_device_bytes", lambda device: 1000)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))  # 1152, 128, 256, 8 B
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.INFO, logger="diagkit"):
        w = diagkit.watch(model, opt, steps=3, memory_budget=0.5)  # 500 bytes
        train(model, opt, 3)
    diag = w.diagnosis
    assert diag.meta["over_budget"] == ["0.weight"]
    assert any("memory_budget=0.5" in r.getMessage() for r in caplog.records)
    assert set().union(*diag.verdicts().values()) == {"ok"}  # the verdicts stay exact
    assert diag.params.set_index("name").loc["0.weight", "changed_steps"] == 3
    w2 = diagkit.watch(model, opt, steps=2)  # the default budget: 250 bytes of the fake 1000
    train(model, opt, 2)
    assert w2.diagnosis.meta["over_budget"] == ["0.weight", "2.weight"]  # largest first
    monkeypatch.setattr(split_probe, "free_device_bytes", lambda device: 10**6)  # room enough
    w3 = diagkit.watch(model, opt, steps=2)
    train(model, opt, 2)
    assert "over_budget" not in w3.diagnosis.meta
