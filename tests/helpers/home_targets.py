"""Targets whose orphans have one right group to join (`diagkit.judge.homes`): the optimizer
split by weight decay, by module, or both. Each is a target for `--try-fix` and, through
`setup(...)`, a watched run of a test."""

from __future__ import annotations

import torch

from models import TwoHeads, two_heads_groups


def _setup(model, optimizer, steps=3):
    batches = [torch.randn(4, 8, generator=torch.Generator().manual_seed(k)) for k in range(8)]
    it = iter(batches * 4)
    return {"model": model, "optimizer": optimizer, "batch_fn": lambda: next(it),
            "loss_fn": lambda m, x: m(x), "steps": steps}


def by_decay():
    """Two groups, decay (weights) and no decay (biases), head2 left out of both."""
    torch.manual_seed(0)
    m = TwoHeads()
    opt = torch.optim.AdamW(two_heads_groups(dict(m.named_parameters()), planted=True), lr=0.01)
    return _setup(m, opt)


def bias_left_out():
    """The same split, but only head2.bias left out: its sibling weight is in the decay group,
    the bias belongs to the no-decay one."""
    torch.manual_seed(0)
    m = TwoHeads()
    named = dict(m.named_parameters())
    groups = two_heads_groups(named, planted=True)
    groups[0]["params"].append(m.head2.weight)
    return _setup(m, torch.optim.AdamW(groups, lr=0.01))


def by_module():
    """One group per part with its own lr, every group decaying its biases too: head2.bias
    joins head2.weight's group (its lr), not body's."""
    torch.manual_seed(0)
    m = TwoHeads()
    opt = torch.optim.AdamW([{"params": list(m.body.parameters()) + list(m.head.parameters())},
                             {"params": [m.head2.weight], "lr": 0.05}],
                            lr=0.01, weight_decay=0.1)
    return _setup(m, opt)
