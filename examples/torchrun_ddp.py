"""An ordinary torchrun DDP fine-tuning job, written without diagkit in mind.

The bug: the backbone is frozen while the head warms up, and unfrozen *after* DDP was built.
DDP only synchronises what required grad when it was built, so every rank now trains its own
backbone on its own data: the ranks silently stop training one model. The lines marked
`# diagkit` are all it takes (docs/watch.md, "Inside your torchrun job"): every rank observes,
rank 0 gathers them over the job's own process group and writes `diag/`.

    torchrun --nproc-per-node 2 examples/torchrun_ddp.py
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-endpoint HOST:PORT ... (and 1)

`--hang-rank R` makes rank R stop talking after two steps (a stuck data loader, say): it is how
the tests show that rank 0 still reports, within `timeout`, with every step the others saw.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import diagkit  # diagkit


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.backbone(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hang-rank", type=int, default=None)
    parser.add_argument("--no-ddp-sync", action="store_true",
                        help="train without DDP (the ranks only share the process group)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    model.backbone.requires_grad_(False)  # warm up the head first
    ddp = model if args.no_ddp_sync else DDP(model)
    model.backbone.requires_grad_(True)  # bug: unfrozen after DDP was built
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = diagkit.watch(ddp, opt, steps=4, out="diag", timeout=8)  # diagkit
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the data
    for step in range(args.steps):
        if step == 2 and rank == args.hang_rank:
            time.sleep(3600)
        x = torch.randn(16, 8, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    first = model.backbone[0].weight.detach().clone()
    gathered = [torch.zeros_like(first) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, first)
    if rank == 0:
        same = all(torch.equal(gathered[0], other) for other in gathered)
        print("backbones identical across ranks:", same)
        print(watch.diagnosis)  # diagkit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
