"""Engines whose tensors are not the model's are refused in one line, never judged
(`diagkit.measure.engines.refused`, docs/distributed.md, "Engines"): an optimizer wrapper diagkit does not
know, holding flat buffers, must end in that line, not in `orphan` for the whole model. The
real bugs that look alike (a stale head after a rebuild, a scalar passed to forward) are still
judged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import diagkit
from diagkit.measure.model.inventory import take_inventory
from models import MLP, fixed_batch, sum_loss


class FlatAdam(torch.optim.Optimizer):
    """A wrapper of the kind ZeRO or a fused optimizer is: it trains one flat fp32 copy of the
    model's tensors and copies it back after each step (its own groups hold only the copy)."""

    def __init__(self, params, lr=1e-2):
        self.model_params = list(params)
        flat = torch.cat([p.detach().reshape(-1) for p in self.model_params]).clone()
        self.flat = nn.Parameter(flat)
        self.inner = torch.optim.Adam([self.flat], lr=lr)
        super().__init__([self.flat], {"lr": lr})

    def step(self, closure=None):
        self.flat.grad = torch.cat([p.grad.reshape(-1) for p in self.model_params])
        self.inner.step()
        offset = 0
        with torch.no_grad():
            for p in self.model_params:
                p.copy_(self.flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


def test_a_wrapper_holding_flat_buffers_is_one_line_not_a_whole_model_orphan():
    model = MLP()
    opt = FlatAdam(model.parameters())
    with pytest.raises(diagkit.DiagkitError) as caught:
        diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=sum_loss, steps=2)
    line = str(caught.value)
    assert "\n" not in line
    assert "cannot observe this optimizer exactly" in line and "1 flat 1-D tensor" in line
    assert f"({sum(p.numel() for p in model.parameters()):,} elements)" in line
    with pytest.raises(diagkit.DiagkitError, match="flat 1-D"):
        diagkit.watch(model, opt)


def test_a_rank_share_of_the_flat_buffer_is_refused_too(monkeypatch):
    """At world 2 a rank holds half the flat partition: still the engine's signature."""
    from diagkit.measure.engines import refused as engines
    model = MLP()
    half = sum(p.numel() for p in model.parameters()) // 2
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(half))], lr=0.1)
    monkeypatch.setattr(engines, "_world", lambda: 2)
    with pytest.raises(diagkit.DiagkitError, match="flat 1-D"):
        take_inventory(model, [opt])
    monkeypatch.setattr(engines, "_world", lambda: 1)
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(half // 4))], lr=0.1)
    take_inventory(model, [opt])  # a quarter of the model: not what a partition looks like
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(half * 2)), model.fc1.bias], lr=0.1)
    take_inventory(model, [opt])  # it holds a tensor of the model: judged


def test_a_stale_head_after_a_rebuild_is_still_judged():
    """The optimizer holds the old head (not_in_model), the new head is held by none
    (orphan): the shapes match, so it is a bug to report, not an engine to refuse."""
    model = MLP()
    old = list(model.fc2.parameters())
    opt = torch.optim.SGD([*model.fc1.parameters(), *old], lr=0.1)
    model.fc2 = nn.Linear(5, 3)
    diag = diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=sum_loss, steps=2)
    verdicts = diag.verdicts()
    assert "orphan" in verdicts["fc2.weight"] and "orphan" in verdicts["fc2.bias"]
    assert sum("not_in_model" in v for v in verdicts.values()) == 2


def test_a_scalar_passed_to_forward_is_still_judged():
    """One stray element beside tensors of the model is no flat buffer."""
    model = MLP()
    temperature = nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([*model.fc1.parameters(), temperature], lr=0.1)
    diag = diagkit.diagnose(model, opt, batch_fn=fixed_batch,
                            loss_fn=lambda m, b: (m(b) * temperature).sum(), steps=2)
    assert "orphan" in diag.verdicts()["fc2.weight"]


@pytest.mark.parametrize("mark, words", [
    ("_fsdp_flattened", "FSDP1.s flat parameters"),
    ("ds_id", "DeepSpeed ZeRO-3's partitioned parameters"),
])
def test_engine_tensors_known_by_their_marks_are_refused(mark, words):
    """FSDP1's FlatParameter and ZeRO-3's placeholders carry these attributes (duck-typed:
    no engine is imported); the real engines run in tests/e2e/test_fsdp.py."""
    model = MLP()
    setattr(model.fc1.weight, mark, True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(diagkit.DiagkitError, match=words):
        take_inventory(model, [opt])
