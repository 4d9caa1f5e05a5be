"""A correctly wired model: every trainable tensor used, in exactly one group, decay split."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import decay_groups


class TinyClassifier(nn.Module):
    def __init__(self, d_in: int = 16, d: int = 32, classes: int = 4):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.norm = nn.LayerNorm(d)
        self.hidden = nn.Linear(d, d)
        self.out = nn.Linear(d, classes)

    def forward(self, x):
        h = F.gelu(self.norm(self.inp(x)))
        return self.out(h + F.gelu(self.hidden(h)))


def clean(steps: int = 5, seed: int = 0, batch: int = 16, lr: float = 1e-3,
          weight_decay: float = 0.01):
    torch.manual_seed(seed)
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)

    def batch_fn():
        x = torch.randn(batch, 16, generator=gen)
        return x, (x[:, :4].argmax(dim=1))

    def loss_fn(model, data):
        x, y = data
        return F.cross_entropy(model(x), y)

    return {"model": model, "optimizer": optimizer, "batch_fn": batch_fn, "loss_fn": loss_fn,
            "steps": steps}
