"""The user's own loop as the watch tests write it (`plain_loop`), a model with a head the
optimizer leaves out (`dead_head`), and the hooks left on a model and its optimizers
(`hook_counts`: per tensor, per optimizer, torch's global ones)."""

from __future__ import annotations

import torch

from models import WithDeadHead, fixed_batch, mse_loss


def hook_counts(model, optimizers):
    """Every hook diagkit could have left: on tensors, on optimizers, and torch's global ones."""
    from torch.optim import optimizer as optim_mod
    tensors = sum(len(p._backward_hooks or {}) for p in model.parameters())
    opt = sum(len(o._optimizer_step_pre_hooks) + len(o._optimizer_step_post_hooks)
              for o in optimizers)
    return tensors, opt, len(optim_mod._global_optimizer_pre_hooks) + len(
        optim_mod._global_optimizer_post_hooks)


def plain_loop(model, opt, steps, *, zero="optimizer", batch=None, accumulate=1, clip=None,
               scheduler=None):
    """An ordinary user loop: the code diagkit watches, never changes."""
    batch = fixed_batch() if batch is None else batch
    losses = []
    for _ in range(steps):
        if zero == "optimizer":
            opt.zero_grad()
        elif zero == "model":
            model.zero_grad()
        for _ in range(accumulate):
            loss = mse_loss(model, batch) / accumulate
            loss.backward()
            losses.append(loss.detach().clone())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return losses


def dead_head():
    torch.manual_seed(0)
    model = WithDeadHead()
    return model, torch.optim.SGD(model.body.parameters(), lr=0.1)
