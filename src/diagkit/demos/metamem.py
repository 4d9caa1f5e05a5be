"""First seed: memory tokens that require grad, get gradients, and sit in no optimizer group.

A meta-network wraps a frozen language model whose `mem_tokens` are re-enabled for training,
then builds its optimizer groups from the DDP-wrapped names with
`not n.startswith("module.metamodel")`, which silently drops `module.metamodel.model.mem_tokens`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import token_batches, wrap_like_ddp


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, h, lora=None):
        x = self.norm(h)
        y = self.fc(x)
        if lora is not None:
            y = y + lora(x)
        return h + F.gelu(y)


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, d: int, n_mem: int, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mem_tokens = nn.Parameter(torch.randn(n_mem, d) * 0.02)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, ids, lora=None):
        mem = self.mem_tokens.unsqueeze(0).expand(ids.shape[0], -1, -1)
        h = torch.cat([mem, self.embed(ids)], dim=1)
        for layer in self.layers:
            h = layer(h, lora)
        return self.norm(h)


class MetaModel(nn.Module):
    def __init__(self, vocab, d, n_mem):
        super().__init__()
        self.model = LanguageModel(vocab, d, n_mem)


class MetaLoRA(nn.Module):
    def __init__(self, d: int, rank: int = 4):
        super().__init__()
        self.lora_A = nn.Parameter(torch.randn(d, rank) * 0.1)
        self.lora_B = nn.Parameter(torch.randn(rank, d) * 0.1)

    def forward(self, x, scale):
        return (x @ self.lora_A @ self.lora_B) * scale


class MetaNetwork(nn.Module):
    """Reads the memory states, turns them into a LoRA scale, runs the model again with it."""

    def __init__(self, vocab: int, d: int, n_mem: int):
        super().__init__()
        self.n_mem = n_mem
        self.metamodel = MetaModel(vocab, d, n_mem)
        self.hypernet = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.metalora = MetaLoRA(d)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, ids):
        memory = self.metamodel.model(ids)[:, : self.n_mem].mean(dim=1)
        scale = self.hypernet(memory)[:, None, :]
        h = self.metamodel.model(ids, lora=lambda x: self.metalora(x, scale))
        return self.lm_head(h[:, self.n_mem:])


def freeze(metamodel: MetaModel) -> None:
    """As in the seed's utils/myfreeze.py: freeze everything, then re-enable the memory."""
    for param in metamodel.parameters():
        param.requires_grad = False
    metamodel.model.mem_tokens.requires_grad = True


def iter_learnable_tensors(module: nn.Module):
    return (p for p in module.parameters() if p.requires_grad)


def meta_memory(steps: int = 5, seed: int = 0, vocab: int = 64, d: int = 32, n_mem: int = 4,
                seq: int = 12, batch: int = 8, lr: float = 1e-3, weight_decay: float = 0.01):
    torch.manual_seed(seed)
    metanet = MetaNetwork(vocab, d, n_mem)
    freeze(metanet.metamodel)
    # Real DDP under `--nproc` (built after freeze(): DDP skips the frozen backbone, and every
    # trainable tensor, mem_tokens included, is used, so find_unused_parameters=False holds).
    ddp_metanet = wrap_like_ddp(metanet)
    no_decay = ["bias", "norm"]
    named = list(ddp_metanet.named_parameters())
    optimizer = torch.optim.AdamW([
        {
            "params": [p for n, p in named
                       if not any(nd in n for nd in no_decay)
                       and not n.startswith("module.metamodel") and ".metalora." not in n],
            "weight_decay": weight_decay,
        },
        {
            "params": [p for n, p in named
                       if any(nd in n for nd in no_decay)
                       and not n.startswith("module.metamodel") and ".metalora." not in n],
            "weight_decay": 0.0,
        },
        {"params": list(iter_learnable_tensors(metanet.metalora)), "weight_decay": weight_decay},
    ], lr=lr)
    # One fixed batch, as in a memorise-one-batch sanity run: the memory's gradient then points
    # the same way every step, and its uncleared .grad visibly grows.
    fixed = token_batches(vocab, batch, seq + 1, seed + 1)()

    def loss_fn(model, ids):
        logits = model(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))

    return {"model": ddp_metanet, "optimizer": optimizer, "batch_fn": lambda: fixed,
            "loss_fn": loss_fn, "steps": steps}
