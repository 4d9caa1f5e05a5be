"""The scenarios of the mode tests (tests/e2e/test_modes*.py): each builds a small training
setup afresh (its model, optimizer and loop, as `diagnose` keyword arguments), so that every
mode runs the same training; `run` diagnoses one with a fixed seed."""

from __future__ import annotations

import torch
import torch.nn as nn

import diagkit
from models import (MLP, EvenBranch, MaskedHead, NormNet, Reuse, SqrtAtZero, TiedLM,
                    WithDeadHead, ZeroGate, fixed_batch, freeze_fc1_weight_at_step_2, mse_loss,
                    sum_loss)


def standard(model, opt, loss=mse_loss, steps=3, **kw):
    """The standard loop on one fixed batch: the keyword arguments of `diagnose`."""
    x = fixed_batch()
    return dict(model=model, optimizer=opt, batch_fn=lambda: x, loss_fn=loss, steps=steps, **kw)


def orphan():
    model = MLP()
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if n != "fc2.bias"], lr=0.01)
    return standard(model, opt, loss=sum_loss, steps=4)


def dead_head():
    model = WithDeadHead()
    return standard(model, torch.optim.AdamW(model.parameters(), lr=0.01))


def frozen_in_optimizer():
    model = MLP()
    model.fc1.weight.requires_grad_(False)
    return standard(model, torch.optim.AdamW(model.parameters(), lr=0.01))


def frozen_but_changing():
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=opt, steps=4,
                train_step=freeze_fc1_weight_at_step_2(model, opt, fixed_batch()))


def lr_zero():
    model = MLP()
    opt = torch.optim.AdamW([{"params": model.fc1.parameters(), "lr": 0.0},
                             {"params": model.fc2.parameters()}], lr=0.01)
    return standard(model, opt)


def zero_gradient():
    model = ZeroGate()
    return standard(model, torch.optim.SGD(model.parameters(), lr=0.05))


def nonfinite():
    model = SqrtAtZero()
    return standard(model, torch.optim.SGD(model.parameters(), lr=0.05), loss=lambda m, b: m(b))


def masked_inf():
    model = MaskedHead()
    return standard(model, torch.optim.SGD(model.fc.parameters(), lr=0.05),
                     loss=lambda m, b: m(b)[:, 0].sum(), steps=2)


def masked_inf_held():
    """The masked head with its inf mask held by the optimizer: snapshotted in exact mode
    (held by none, it is fingerprinted: docs/cost.md)."""
    model = MaskedHead()
    return standard(model, torch.optim.SGD(model.parameters(), lr=0.05),
                     loss=lambda m, b: m(b)[:, 0].sum(), steps=2)


def norm_decay():
    model = NormNet()
    return standard(model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))


def tied():
    model = TiedLM()
    tokens = torch.randint(0, 7, (4, 5), generator=torch.Generator().manual_seed(2))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
                batch_fn=lambda: tokens, loss_fn=lambda m, b: m(b).logsumexp(-1).mean(), steps=3)


def reused():
    model = Reuse()
    return standard(model, torch.optim.SGD(model.parameters(), lr=0.05))


def branch():
    model = EvenBranch()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = fixed_batch()

    def train_step(i):
        opt.zero_grad()
        loss = model(x, use_extra=i % 2 == 0).pow(2).mean()
        loss.backward()
        opt.step()
        return loss
    return dict(model=model, optimizer=opt, train_step=train_step, steps=4)


class Odd(nn.Module):
    """Layouts the bucketed and fingerprinted paths must survive."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8, sparse=True)          # sparse gradients
        self.t = nn.Parameter(torch.randn(8, 6).t())         # non-contiguous
        self.bf = nn.Parameter(torch.randn(6, 6, dtype=torch.bfloat16))
        self.s1 = nn.Parameter(torch.tensor(0.5))            # 0-d, grouped together
        self.s2 = nn.Parameter(torch.tensor(1.5))
        self.b1 = nn.Parameter(torch.zeros(6))
        self.b2 = nn.Parameter(torch.zeros(6))

    def forward(self, idx):
        y = (self.emb(idx).mean(0) @ self.t.t()) * self.s1 * self.s2
        return (y + (y.to(torch.bfloat16) @ self.bf).float() + self.b1 + self.b2).pow(2).sum()


def odd_layouts():
    model = Odd()
    dense = [p for n, p in model.named_parameters() if n != "emb.weight"]
    opts = [torch.optim.SGD(dense, lr=0.01), torch.optim.SparseAdam([model.emb.weight], lr=0.01)]
    idx = torch.tensor([1, 2, 3])
    return dict(model=model, optimizer=opts, batch_fn=lambda: idx, loss_fn=lambda m, b: m(b),
                steps=3)


def in_two_optimizers():
    model = MLP()
    opts = [torch.optim.SGD(model.parameters(), lr=0.05),
            torch.optim.SGD([model.fc2.weight], lr=0.01)]  # fc2.weight held twice
    return standard(model, opts)


class Siblings(nn.Module):
    """Same-shaped layers share a bucket; one of them sits out every other batch, so its
    group must fall back to one-by-one norms on those steps."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, batch):
        x, use_c = batch
        y = self.b(torch.tanh(self.a(x)))
        return (self.c(y) if use_c else y).pow(2).mean()


def partly_used_group():
    model = Siblings()
    x = fixed_batch()
    count = {"n": 0}

    def batch_fn():
        count["n"] += 1
        return x, count["n"] % 2 == 1
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
                batch_fn=batch_fn, loss_fn=lambda m, b: m(b), steps=4)


def demo(name):
    def build():
        setup = diagkit.load_target(f"diagkit.demos:{name}")
        return dict(model=setup, steps=3)
    build.__name__ = name
    return build


SCENARIOS = [orphan, dead_head, frozen_in_optimizer, frozen_but_changing, lr_zero,
             zero_gradient, nonfinite, masked_inf, norm_decay, tied, reused, branch, odd_layouts,
             in_two_optimizers, partly_used_group,
             demo("meta_memory"), demo("finetune_heads"), demo("clean")]


def run(build, **options):
    """`diagnose` on a scenario built afresh with seed 0, with `options`."""
    torch.manual_seed(0)
    kwargs = build()
    model = kwargs.pop("model")
    return diagkit.diagnose(model, **kwargs, **options)
