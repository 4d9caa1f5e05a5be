"""Pieces the demos share: a DDP-shaped wrapper (the real one under torch.distributed), the
rank, and seeded random batches."""

from __future__ import annotations

import torch
from torch import nn


class WrapperLikeDDP(nn.Module):
    """Stands in for DistributedDataParallel in one process: the same `module.` name prefix.

    The first seed's bug depends on that prefix (`not n.startswith("module.metamodel")`), so the
    single-process demo must see the names the user's DDP code sees.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def distributed() -> bool:
    """True inside an initialized torch.distributed process group (e.g. under `--nproc`)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def current_rank() -> int:
    """This process's rank in the default process group; 0 in a single process."""
    return torch.distributed.get_rank() if distributed() else 0


def wrap_like_ddp(module: nn.Module, **ddp_kwargs) -> nn.Module:
    """`DistributedDataParallel(module, **ddp_kwargs)` inside a process group, else the
    single-process `WrapperLikeDDP(module)`: either way the names start with `module.`.

    `ddp_kwargs` (find_unused_parameters, ...) only matter under real DDP.
    """
    if distributed():
        return torch.nn.parallel.DistributedDataParallel(module, **ddp_kwargs)
    return WrapperLikeDDP(module)


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """minGPT-style split by identity: matrices decay, biases and norm weights don't."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            is_norm = "Norm" in type(module).__name__
            (no_decay if name.endswith("bias") or is_norm or p.dim() < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    held = {id(p) for g in groups for p in g["params"]}
    assert len(held) == len({id(p) for p in model.parameters()}), "every tensor in one group"
    return groups


def token_batches(vocab: int, batch: int, seq: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return lambda: torch.randint(vocab, (batch, seq), generator=gen)
