"""What the tracker tests send: a real diagnosis of a small model whose head is left out of the
optimizer (an orphan, an error, with its fix), and a `Context` whose lines a test reads."""

from __future__ import annotations

import functools

import torch

import diagkit
from diagkit.run.trackers.context import Context
from models import MLP, fixed_batch, mse_loss

ORPHAN = "fc2.weight"  # the head the optimizer does not hold
ORPHAN_FIX = 'optimizer.param_groups[0]["params"].extend(model.fc2.parameters())'


@functools.cache
def orphan_diagnosis():
    """3 observed steps (0, 1, 2) of an MLP whose fc2 is not in the optimizer: one orphan error
    (fc2.weight, fc2.bias) and one warning (their .grad is never cleared)."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    batch = fixed_batch()
    return diagkit.diagnose(model, optimizer, batch_fn=lambda: batch, loss_fn=mse_loss, steps=3)


def context(**fields) -> tuple[Context, list[str]]:
    """A Context whose `say` lines land in the returned list."""
    lines: list[str] = []
    return Context(say=lines.append, **fields), lines


def watch_orphan(report_to, **watch_kwargs):
    """`diagkit.watch(..., report_to=report_to)` over 3 observed steps of the orphan's loop (run
    for 5), waited for until its trackers got everything; the Watch."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    batch = fixed_batch()
    with diagkit.watch(model, optimizer, steps=3, report_to=report_to, **watch_kwargs) as w:
        for _ in range(5):
            optimizer.zero_grad()
            mse_loss(model, batch).backward()
            optimizer.step()
    assert w.trackers is not None and w.trackers.wait(10)
    return w
