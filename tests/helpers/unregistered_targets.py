"""Targets for `--nproc` runs of models with unregistered tensors (each rank imports this file
by path, so it holds its models itself). Batches differ per rank, as in real data parallelism."""

import torch
from torch import nn


class ListCells(nn.Module):
    """Linear layers kept in a plain Python list, and a plain requires_grad tensor."""

    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 4), nn.Linear(4, 4)]  # not an nn.ModuleList
        self.logit_scale = torch.ones((), requires_grad=True)  # not an nn.Parameter
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x) * self.logit_scale


def build(steps: int = 3, wrap: bool = False):
    """`wrap`: the target wraps its model in DDP itself (else diagkit does)."""
    torch.manual_seed(0)
    model = ListCells()
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    gen = torch.Generator().manual_seed(1 + rank)
    if wrap and torch.distributed.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"model": model, "optimizer": opt, "steps": steps,
            "batch_fn": lambda: torch.randn(8, 4, generator=gen),
            "loss_fn": lambda m, x: m(x).pow(2).mean()}
