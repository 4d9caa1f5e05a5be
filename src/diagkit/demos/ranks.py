"""Demos for `diagkit check TARGET --nproc 2`: wiring that goes wrong only across ranks.

Each target also runs in one process (rank 0, no process group), where it gives its
single-process verdict; under torch.distributed it builds real DDP (see `wrap_like_ddp`).

    forward_arg  a trainable tensor passed to forward, not registered on the model: DDP never
                 averages its gradient, so its copies drift apart (rank_divergent; one process:
                 not_in_model)
    rank_branch  a branch used on odd ranks only (rank_dependent_use; one process: unused)
    ddp_strict   the user's own DDP with find_unused_parameters=False and a never-used head: DDP
                 raises on the second step (one process: unused)
    hang         rank 1 sleeps forever inside loss_fn from step `hang_at` (launcher timeout)
    crash        rank 1 raises inside loss_fn at step `crash_at`

Batches are seeded with the seed and the rank, so they differ between ranks and repeat run to run.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from .common import current_rank, distributed, wrap_like_ddp

D_IN, D, OUT = 8, 16, 2


class Net(nn.Module):
    """Two linear layers; `extra` modules are registered but only used where the demo says."""

    def __init__(self, **extra: nn.Module):
        super().__init__()
        self.body = nn.Linear(D_IN, D)
        self.head = nn.Linear(D, OUT)
        for name, module in extra.items():
            self.add_module(name, module)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


class ScaledNet(Net):
    """Multiplies its output by a tensor the caller passes in."""

    def forward(self, x, scale):
        return super().forward(x) * scale


class BranchNet(Net):
    """Adds an `aux` branch on odd ranks only: the rank decides which tensors get gradients."""

    def __init__(self, rank: int):
        super().__init__(aux=nn.Linear(D, D))
        self.use_aux = rank % 2 == 1

    def forward(self, x):
        h = torch.tanh(self.body(x))
        if self.use_aux:
            h = h + torch.tanh(self.aux(h))
        return self.head(h)


def _rank_batches(seed: int, batch: int):
    """Regression batches from a generator seeded with the seed and this process's rank."""
    gen = torch.Generator().manual_seed(seed + 1 + current_rank())

    def batch_fn():
        x = torch.randn(batch, D_IN, generator=gen)
        return x, torch.randn(batch, OUT, generator=gen)

    return batch_fn


def _mse(model, data):
    x, y = data
    return F.mse_loss(model(x), y)


def _setup(model, optimizer, batch_fn, loss_fn, steps):
    return {"model": model, "optimizer": optimizer, "batch_fn": batch_fn, "loss_fn": loss_fn,
            "steps": steps}


def forward_arg(steps: int = 3, seed: int = 0, batch: int = 8, lr: float = 0.1):
    """`scale` is trained (optimizer 0, group 1) but lives outside the model: DDP neither sees
    nor averages its gradient, so with different batches per rank its copies diverge."""
    torch.manual_seed(seed)
    model = wrap_like_ddp(ScaledNet())
    scale = nn.Parameter(torch.ones(OUT))
    optimizer = torch.optim.SGD([{"params": list(model.parameters())}, {"params": [scale]}],
                                lr=lr)

    def loss_fn(model, data):
        x, y = data
        return F.mse_loss(model(x, scale), y)

    return _setup(model, optimizer, _rank_batches(seed, batch), loss_fn, steps)


def rank_branch(steps: int = 3, seed: int = 0, batch: int = 8, lr: float = 0.1):
    """`aux` is used on odd ranks only; find_unused_parameters=True lets DDP run anyway."""
    torch.manual_seed(seed)
    model = wrap_like_ddp(BranchNet(current_rank()), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return _setup(model, optimizer, _rank_batches(seed, batch), _mse, steps)


def ddp_strict(steps: int = 3, seed: int = 0, batch: int = 8, lr: float = 0.1):
    """The user's own DDP (find_unused_parameters=False) over a model whose `old_head` the
    forward never uses: real DDP raises "Expected to have finished reduction in the prior
    iteration ..." on the second step."""
    torch.manual_seed(seed)
    model = wrap_like_ddp(Net(old_head=nn.Linear(D, OUT)))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return _setup(model, optimizer, _rank_batches(seed, batch), _mse, steps)


def _faulty(fault, at: int, steps: int, seed: int, batch: int, lr: float):
    """A correctly wired setup whose loss_fn calls `fault(step)` on rank 1, after its forward,
    from step `at` on (distributed only; loss_fn counts its calls, one per step)."""
    torch.manual_seed(seed)
    model = wrap_like_ddp(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    calls = [0]

    def loss_fn(model, data):
        step = calls[0]
        calls[0] += 1
        loss = _mse(model, data)
        # After the forward: DDP's forward may hold a collective (the bucket rebuild at step 1),
        # and the peers must get past it, so that only this rank is the one that stops.
        if step >= at and distributed() and current_rank() == 1:
            fault(step)
        return loss

    return _setup(model, optimizer, _rank_batches(seed, batch), loss_fn, steps)


def _sleep_forever(step: int) -> None:
    while True:
        time.sleep(0.1)


def hang(steps: int = 3, seed: int = 0, hang_at: int = 1, batch: int = 8, lr: float = 0.1):
    """Rank 1 never returns from loss_fn from step `hang_at` on: for the launcher's timeout."""
    return _faulty(_sleep_forever, hang_at, steps, seed, batch, lr)


def _raise(step: int) -> None:
    raise RuntimeError("rank 1 crashed on purpose")


def crash(steps: int = 3, seed: int = 0, crash_at: int = 1, batch: int = 8, lr: float = 0.1):
    """Rank 1 raises RuntimeError("rank 1 crashed on purpose") in loss_fn at step `crash_at`."""
    return _faulty(_raise, crash_at, steps, seed, batch, lr)
