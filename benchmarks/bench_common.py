"""What every part of the bench shares: the sizes, the two models and how they are built, and
the small context a section runs in.

The sections (`benchmarks/sections/`) and the helper scripts (`watch_time.py`,
`fsdp_time.py`, `group_time.py`, `live_time.py`, ...) import this module; it imports none of
them, and nothing imports the runner (`overhead.py`): the bench's imports point one way
(tests/test_bench_layout.py checks it).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402
from torch import nn  # noqa: E402

SIZES = {
    "full": {
        "gpt": dict(layers=6, d=384, heads=6, vocab=8000, batch=8, ctx=64),
        "small": dict(blocks=250, width=64, batch=32),
        # More rounds steady a median on a noisy host: (a) ~9 s each, (b) ~1 s each.
        "rounds": {"gpt": 11, "small": 15, "group": 7},
        "steps_per_block": {"gpt": 3, "small": 8},
        "mem_steps": 3,
        "report": dict(tensors=2000, steps=200),
        "stride": dict(tensors=2000, steps=1000, every=100, full_steps=20),
        "import_runs": 5,
        "whole": {"gpt": (3, 100), "small": (3, 400), "every": 100, "check": (500, 5000),
                  "long_steps": 200_000},
        "call": {"gpt": (5, 10), "small": (15, 10)},
    },
    "quick": {
        "gpt": dict(layers=2, d=64, heads=4, vocab=500, batch=4, ctx=16),
        "small": dict(blocks=50, width=32, batch=8),
        "rounds": {"gpt": 3, "small": 3, "group": 2}, "steps_per_block": {"gpt": 3, "small": 3},
        "mem_steps": 2,
        "report": dict(tensors=200, steps=20),
        "stride": dict(tensors=200, steps=100, every=10, full_steps=5),
        "import_runs": 2,
        "whole": {"gpt": (1, 30), "small": (1, 40), "every": 10, "check": (50, 500),
                  "long_steps": 2_000},
        "call": {"gpt": (2, 3), "small": (2, 3)},
    },
    "cuda": {
        "gpt_large": dict(layers=24, d=1024, heads=16, vocab=32000, batch=8, ctx=256),
        "rounds": {"gpt_large": 5}, "steps_per_block": {"gpt_large": 3},
        "mem_steps": 3,
    },
}


@dataclass
class Bench:
    """What a section is given: the sizes of this run, its flags, where it writes, the result
    it adds its figures to (under its own keys) and the table it adds its rows to (measure,
    measured, goal, status), row by row, so a section that fails late keeps its first rows."""

    sizes: dict
    mode: str  # "full", "quick" or "cuda"
    out_path: Path
    result: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)
    profile: bool = False

    @property
    def quick(self) -> bool:
        """A smoke run: small sizes, fewer repeats."""
        return self.mode == "quick"


def mark(value: float, goal: float) -> str:
    """A figure's status against a goal it must not exceed."""
    return "met" if value <= goal else "NOT met"


def gpt_engine_step(bench: Bench, key: str, timer, lines, goal: float) -> None:
    """An engine's watched GPT step against that engine's plain one (`timer` and `lines` from
    its timing script: FSDP2's, ZeRO's), under `bench.result[key]`, its rows beside `goal`."""
    sz = bench.sizes
    print(f"[{key.split('_')[0]}] gpt ...", file=sys.stderr, flush=True)
    r = timer(build, "gpt", sz["gpt"], sz["rounds"]["gpt"], sz["steps_per_block"]["gpt"])
    bench.result[key] = {"gpt": r}
    bench.lines += lines("gpt", r, goal)


# ============================================================== models
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, vocab, ctx, **_):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class ManySmall(nn.Module):
    """A residual stack of small Linear layers: ~2 tensors per block, tiny compute each."""

    def __init__(self, blocks, width, **_):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


def build(kind: str, cfg: dict, device: str = "cpu"):
    """model, optimizer, batch_fn, loss_fn (a fixed seed: every process builds the same)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if kind.startswith("gpt"):
        model = GPT(**cfg).to(device)
        batch_fn = lambda: torch.randint(cfg["vocab"], (cfg["batch"], cfg["ctx"] + 1),  # noqa: E731
                                         generator=gen).to(device)

        def loss_fn(m, seq):
            logits = m(seq[:, :-1])
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               seq[:, 1:].reshape(-1))
    else:
        model = ManySmall(**cfg)
        batch_fn = lambda: torch.randn(cfg["batch"], cfg["width"], generator=gen).to(device)  # noqa: E731

        def loss_fn(m, x):
            return m(x).pow(2).mean()
    model = model.to(device)
    return model, two_group_adamw(model), batch_fn, loss_fn


def two_group_adamw(model) -> torch.optim.AdamW:
    """The bench's optimizer: AdamW with decay on matrices and none on vectors, built from the
    model's parameters as they are now (after any wrapping or sharding)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)


def param_facts(model) -> dict:
    """The model's tensors, elements and bytes: what a ratio or an extra peak is read against."""
    ps = list(model.parameters())
    return {"tensors": len(ps), "numel": sum(p.numel() for p in ps),
            "bytes": sum(p.numel() * p.element_size() for p in ps)}


def setup_of(model, opt, batch_fn, loss_fn):
    """The `Setup` diagnose() would be given: the loop it runs is then the one timed here."""
    from diagkit.run.target.target import Setup
    return Setup(model=model, optimizer=opt, batch_fn=batch_fn, loss_fn=loss_fn)
