"""Targets for the fix-preview tests (`--try-fix`), one per kind of fix, on the small models of
`models.py`. Each records what it built in `BUILT` (setup, a snapshot taken right after the
build), so a test can check that the first copy, the user's, is never changed."""

from __future__ import annotations

import copy

import torch
from torch import nn

from models import MLP, NormNet, WithDeadHead, fixed_batch, mse_loss

BUILT: list[tuple[dict, dict]] = []
_SHARED: dict = {}


def _setup(model, optimizer, steps=3):
    batch = fixed_batch()
    setup = {"model": model, "optimizer": optimizer, "batch_fn": lambda: batch,
             "loss_fn": mse_loss, "steps": steps}
    opts = optimizer if isinstance(optimizer, list) else [optimizer]
    BUILT.append((setup, snapshot(model, opts)))
    return setup


def snapshot(model, optimizers) -> dict:
    """The model's values and flags and the optimizers' groups (by tensor identity)."""
    return {"state": copy.deepcopy(model.state_dict()),
            "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
            "groups": [[({k: v for k, v in g.items() if k != "params"},
                         [id(p) for p in g["params"]]) for g in opt.param_groups]
                       for opt in optimizers],
            "state_len": [len(opt.state) for opt in optimizers]}


def orphan(lr: float = 0.05):
    """fc2.bias in no optimizer; its sibling fc2.weight in group 1 (lr `lr`, no decay)."""
    torch.manual_seed(0)
    m = MLP()
    opt = torch.optim.AdamW([{"params": list(m.fc1.parameters()), "weight_decay": 0.01},
                             {"params": [m.fc2.weight], "lr": lr, "weight_decay": 0.0}], lr=0.1)
    return _setup(m, opt)


def unused():
    """A head the forward never calls, in an SGD with momentum (1 state slot per element)."""
    torch.manual_seed(0)
    m = WithDeadHead()
    return _setup(m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))


def frozen_in_optimizer():
    """fc1 frozen but still held by Adam (2 state slots per element)."""
    torch.manual_seed(0)
    m = MLP()
    m.fc1.requires_grad_(False)
    return _setup(m, torch.optim.Adam(m.parameters(), lr=0.01))


def decay_on_norm():
    torch.manual_seed(0)
    m = NormNet()
    return _setup(m, torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1))


def in_two_optimizers():
    torch.manual_seed(0)
    m = MLP()
    first = torch.optim.SGD(m.parameters(), lr=0.1)
    second = torch.optim.SGD(m.fc2.parameters(), lr=0.1)
    return _setup(m, [first, second])


def stale_tensor():
    """The optimizer also holds a tensor the model does not (a stale head)."""
    torch.manual_seed(0)
    m = MLP()
    stale = nn.Parameter(torch.randn(3, 3))
    return _setup(m, torch.optim.SGD([{"params": list(m.parameters())}, {"params": [stale]}],
                                     lr=0.1))


def shared():
    """Returns the same model and optimizer on every call: no fresh copy to fix."""
    if not _SHARED:
        torch.manual_seed(0)
        m = WithDeadHead()
        _SHARED.update(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    batch = fixed_batch()
    return {**_SHARED, "batch_fn": lambda: batch, "loss_fn": mse_loss, "steps": 2}
