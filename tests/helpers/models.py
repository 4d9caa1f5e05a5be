"""The models the tests share: small, built from code with a fixed seed, never downloaded.

Each is the smallest model that shows one wiring (a dead head, a data-dependent branch, tied
weights, a module reused twice, ...); the end-to-end tests diagnose them, the unit tests of
other layers reuse them.
"""

from __future__ import annotations

from pathlib import Path

import math

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in=4, d_hidden=5, d_out=3):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def sum_loss(model, batch):
    return model(batch).sum()


def mse_loss(model, batch):
    return model(batch).pow(2).mean()


def fixed_batch(n=6, d=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g)


class WithDeadHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.dead = nn.Linear(4, 2)  # left over from pretraining; forward never calls it

    def forward(self, x):
        return self.body(x)


class EvenBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)

    def forward(self, x, use_extra):
        h = self.trunk(x)
        return self.extra(h) if use_extra else h


def freeze_fc1_weight_at_step_2(model, opt, x):
    """A train_step that zeroes .grad in place (no set_to_none) and freezes fc1.weight at
    step 2: the zeroed .grad stays, so momentum or Adam's state keep moving it."""
    def train_step(i):
        opt.zero_grad(set_to_none=False)
        if i == 2:
            model.fc1.weight.requires_grad_(False)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss
    return train_step


class ZeroGate(nn.Module):
    """`gate` is in the graph but multiplied by 0: autograd gives it exact zeros."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.gate = nn.Parameter(torch.full((3,), 0.5))

    def forward(self, x):
        return self.fc(x) + 0 * self.gate


class SqrtAtZero(nn.Module):
    """d/ds sqrt(s - s.detach()) at 0 is +inf, every time, with a finite loss on step 0."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.s = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return self.fc(x).pow(2).mean() + torch.sqrt(self.s - self.s.detach()).sum()


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)
        self.out = nn.Linear(4, 2, bias=False)

    def forward(self, x):
        return self.out(self.ln(self.fc(x)))


class TiedLM(nn.Module):
    def __init__(self, vocab=7, dim=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.emb(tokens))))


class Reuse(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.block(torch.tanh(self.block(x))))


class MaskedHead(nn.Module):
    """A constant additive mask stored as a frozen Parameter (a common pattern)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.mask = nn.Parameter(torch.tensor([0.0, -math.inf, 0.0]), requires_grad=False)

    def forward(self, x):
        return torch.softmax(self.fc(x) + self.mask, dim=-1)


# ------------------------------------------------------------------ unregistered tensors
class ListCells(nn.Module):
    """LSTM cells kept in a plain Python list: `.parameters()` never sees them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cells = [nn.LSTMCell(4, 4), nn.LSTMCell(4, 4)]  # the bug: not an nn.ModuleList
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = c = torch.zeros(x.shape[0], 4)
        for cell in self.cells:
            h, c = cell(x, (h, c))
        return self.head(h)


class PlainMemory(nn.Module):
    """Memory keys as a plain tensor with requires_grad, values in a dict: never trained."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(4, 4)
        self.mem_keys = torch.randn(3, 4, requires_grad=True)  # the bug: not an nn.Parameter
        self.memory = {"values": torch.randn(3, 4, requires_grad=True)}

    def forward(self, x):
        q = self.proj(x)
        attn = torch.softmax(q @ self.mem_keys.t(), dim=-1)
        return attn @ self.memory["values"]


class TakesPrompt(nn.Module):
    """The forward takes a learnable-looking tensor as an argument (see `prompt_loss`)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, prompt):
        return self.fc(x + prompt)


def make_prompt_loss():
    """A loss_fn that passes a persistent tensor as the forward's argument, and scales by a
    tensor the model never holds (reachable only through the loss)."""
    prompt = torch.zeros(4, requires_grad=True)
    scale = torch.ones((), requires_grad=True)

    def loss_fn(model, batch):
        return (model(batch, prompt) * scale).pow(2).mean()
    return loss_fn, prompt, scale


class GanPair(nn.Module):
    """A tiny DCGAN: `G` maps noise to samples, `D` scores them (one logit). The canonical
    loop (`tests/run/diagnose/test_carried_grad.py`) backpropagates G's loss through D after D stepped."""

    def __init__(self, d_noise=3, d_data=4, d_hidden=8):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(d_noise, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_data))
        self.D = nn.Sequential(nn.Linear(d_data, d_hidden), nn.LeakyReLU(0.2),
                               nn.Linear(d_hidden, 1))


class ActorCritic(nn.Module):
    """A shared trunk with a policy head and a value head: two losses through one trunk."""

    def __init__(self, d_obs=4, d_hidden=8, n_actions=3):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_obs, d_hidden), nn.Tanh())
        self.actor = nn.Linear(d_hidden, n_actions)
        self.critic = nn.Linear(d_hidden, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return torch.log_softmax(self.actor(h), dim=-1), self.critic(h).squeeze(-1)


# ------------------------------------------------------------------ the engine tests' model
class TwoHeads(nn.Module):
    """A body and two heads, both trained by the loss: an optimizer built without `head2` plants
    the orphan the engine tests look for (DeepSpeed, FSDP1), whose clean twin holds it too.
    Uneven sizes (head2 has 3 outputs) leave a rank with part of a tensor, or none of it."""

    def __init__(self):
        super().__init__()
        self.body, self.head, self.head2 = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return self.head(h).pow(2).mean() + self.head2(h).pow(2).mean()


def two_heads_groups(named: dict, planted: bool) -> list[dict]:
    """Two groups (decay, no decay) of `TwoHeads`' tensors by name; `planted`: head2 left out."""
    held = ("body", "head") + (() if planted else ("head2",))
    return [{"params": [named[f"{m}.weight"] for m in held], "weight_decay": 0.01},
            {"params": [named[f"{m}.bias"] for m in held], "weight_decay": 0.0}]


def two_heads_cell(steps: int, wait: str = "") -> str:
    """The first cell of the workbook tests (a notebook in JupyterLab, an IPython shell):
    tests/helpers/ importable, `TwoHeads` with head2 left out of `optimizer` (two groups: decay
    and no decay), and a `loader` of `steps` + 10 batches, each after `wait` (code that sleeps:
    a loader that takes its time gives a live panel time to move)."""
    helpers = str(Path(__file__).resolve().parent)
    return f"""import sys, time
sys.path.insert(0, {helpers!r})
import torch
import diagkit
from models import TwoHeads, two_heads_groups
torch.manual_seed(0)
model = TwoHeads()
optimizer = torch.optim.SGD(two_heads_groups(dict(model.named_parameters()), planted=True),
                            lr=0.05)

def batches(n):
    for i in range(n):
        {wait or "pass"}
        yield torch.randn(4, 8)

loader = batches({steps} + 10)
loss_fn = lambda model, batch: model(batch)"""


def rank_batches(n: int, rank: int) -> list[torch.Tensor]:
    """`n` batches for `TwoHeads`, the same on every run and different on every rank."""
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(4, 8, generator=g) for _ in range(n)]


def watched_under_ddp(planted: bool, steps: int):
    """The engine tests' oracle, inside a process group: `TwoHeads` (seed 0) under DDP, Adam
    (lr 0.01) over `two_heads_groups`, `rank_batches`, watched for `steps` steps. The engines
    run the same model, data and bug; their measurements must equal these. Returns the Watch."""
    import torch.distributed as dist

    import diagkit

    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(TwoHeads())
    opt = torch.optim.Adam(two_heads_groups(dict(ddp.module.named_parameters()), planted),
                           lr=0.01)
    w = diagkit.watch(ddp, opt, steps=steps)
    for x in rank_batches(steps, dist.get_rank()):
        opt.zero_grad()
        ddp(x).backward()
        opt.step()
    return w


def forward_forward(layers, opts, per_layer: int) -> None:
    """Forward-forward training: each layer with its own optimizer, trained `per_layer` steps
    after the one before it (on that one's output, without gradients): optimizers that take
    turns."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    for k, (layer, opt) in enumerate(zip(layers, opts)):
        for _ in range(per_layer):
            h = x
            with torch.no_grad():
                for prev in layers[:k]:
                    h = torch.relu(prev(h))
            opt.zero_grad()
            layer(h).pow(2).mean().backward()
            opt.step()
