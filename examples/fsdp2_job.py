"""An FSDP2 (`fully_shard`) training job, as a diagkit target and as a torchrun program.

The bug it can show (`--optimizer-first`, or the target argument `optimizer_first=True`): the
optimizer is built before `fully_shard`, which replaces every parameter of the model by a new
DTensor parameter. The optimizer then holds the old tensors (`not_in_model`) and the model's
own ones are in no optimizer (`orphan`): nothing the model computes with ever trains.

    diagkit check examples/fsdp2_job.py:build --nproc 2
    diagkit check examples/fsdp2_job.py:build --nproc 2 --arg optimizer_first=true
    torchrun --nproc-per-node 2 examples/fsdp2_job.py [--optimizer-first]   # watch, diag/

`diagnose` on one process works too, under a process group of one (`build` starts one if there
is none, as FSDP2 needs it). The torchrun program also writes, with `--expect FILE`, what it
measures itself of the whole tensors at its last step (each gradient's and change's norm, from
`full_tensor()`): the tests check that diagkit's combined shard norms equal them.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import diagkit  # diagkit


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.Tanh())
                                     for _ in range(2)])
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)  # 3 rows: one rank's shard is smaller than the other's

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(self.norm(h))


def _process_group() -> None:
    """FSDP2 needs a process group: one of a single process if none was started."""
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)


def sharded_model(optimizer_first: bool = False, seed: int = 0):
    """(model, optimizer): blocks and root sharded, the optimizer built after (or before)."""
    _process_group()
    torch.manual_seed(seed)
    model = Net()
    early = _optimizer(model) if optimizer_first else None
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, early or _optimizer(model)


def _optimizer(model):
    """AdamW with weight decay on the matrices only (none on biases and norms)."""
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                              {"params": [p for p in params if p.dim() < 2],
                               "weight_decay": 0.0}], lr=1e-2, weight_decay=0.01)


def build(optimizer_first: bool = False, steps: int = 3, seed: int = 0):
    """The diagkit target: every rank draws the same batches (enough for the check)."""
    model, optimizer = sharded_model(optimizer_first, seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def batch_fn():
        return torch.randn(6, 8, generator=gen)

    def loss_fn(model, x):
        return model(x).pow(2).mean()

    return {"model": model, "optimizer": optimizer, "batch_fn": batch_fn, "loss_fn": loss_fn,
            "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer-first", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="diag")
    parser.add_argument("--expect", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt = sharded_model(args.optimizer_first)
    watch = diagkit.watch(model, opt, steps=args.steps, out=args.out)  # diagkit
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(args.steps):
        before = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        model(torch.randn(6, 8, generator=gen)).pow(2).mean().backward()
        grads = {n: float(p.grad.full_tensor().norm()) if p.grad is not None else None
                 for n, p in model.named_parameters()}
        opt.step()
        deltas = {n: float((p.detach().full_tensor() - before[n]).norm())
                  for n, p in model.named_parameters()}
    watch.stop()  # diagkit (it stops by itself after --steps; this ends it sooner)
    if args.expect and rank == 0:
        with open(args.expect, "w") as f:
            json.dump({"grad_norm": grads, "delta_norm": deltas}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
