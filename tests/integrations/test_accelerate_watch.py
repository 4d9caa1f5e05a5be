"""`diagkit.watch` on what `accelerator.prepare` returns, with a real `Accelerator` on the CPU:
the `AcceleratedOptimizer` is seen through, and under `accelerator.accumulate` only the real
optimizer steps count (accelerate's wrapper skips the inner `step()` while accumulating)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import diagkit
from integration_helpers import NO_HOOKS, hooks_left, observed_steps
from models import WithDeadHead

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402


@pytest.fixture
def accelerator():
    """A fresh Accelerator (its state is a process-wide singleton): reset before and after."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield lambda **kw: accelerate.Accelerator(cpu=True, **kw)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def loader(n=32):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4)


def accumulating_loop(accelerator, model, optimizer, data, clip=None):
    for (x,) in data:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).pow(2).mean())
            if clip is not None and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()


def test_accumulation_counts_the_real_optimizer_steps(accelerator):
    acc = accelerator(gradient_accumulation_steps=4)
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(model.body.parameters(), lr=0.1)  # the head is left out: an orphan
    model, opt, data = acc.prepare(model, opt, loader())
    assert type(opt).__name__ == "AcceleratedOptimizer"
    w = diagkit.watch(model, opt, steps=50)
    accumulating_loop(acc, model, opt, data, clip=1.0)  # 8 batches: 2 optimizer steps
    diag = w.stop()
    assert observed_steps(diag) == [0, 1] and diag.meta["optimizer_steps"] == 2
    assert hooks_left(model, [opt]) == NO_HOOKS
    verdicts = diag.verdicts()
    # accelerate's optimizer.zero_grad() never clears what it does not hold: .grad piles up
    assert verdicts.pop("head.weight") == verdicts.pop("head.bias") == {"orphan",
                                                                        "grad_not_cleared"}
    assert set().union(*verdicts.values()) == {"ok"}


def test_prepared_model_and_optimizer_give_the_verdicts_of_the_plain_ones(accelerator):
    def run(prepare):
        torch.manual_seed(0)
        model = WithDeadHead()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        data = loader()
        acc = accelerator() if prepare else None
        if prepare:
            model, opt, data = acc.prepare(model, opt, data)
        w = diagkit.watch(model, opt, steps=3)
        for (x,) in data:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            acc.backward(loss) if prepare else loss.backward()
            opt.step()
        assert w.done and hooks_left(model, [opt]) == NO_HOOKS
        return w.diagnosis.verdicts()

    prepared = run(prepare=True)
    assert prepared == run(prepare=False)
    assert prepared["dead.weight"] == {"unused"} and prepared["body.weight"] == {"ok"}
