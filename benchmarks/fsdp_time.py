"""G. FSDP2: `diagkit.watch` on the GPT sharded with `fully_shard` (world 1, gloo), per-step time
watched vs the same sharded model's plain step, interleaved as in F (`watch_time.time_watch`).

Under a process group every tensor stays hooked (no share is earned), each rank measures its
shards, one all-reduce per observed step combines them, and each observed step is published
to the group's store for rank 0: this is that whole price, on one rank.
"""

from __future__ import annotations


def shard_blocks(model):
    """`fully_shard` each block of the bench's model, then the root (the usual FSDP2 layout)."""
    from torch.distributed.fsdp import fully_shard

    for block in getattr(model, "blocks", None) or getattr(model, "layers"):
        fully_shard(block)
    fully_shard(model)
    return model


def time_fsdp(build, kind: str, cfg: dict, rounds: int, k: int) -> dict:
    """`time_watch` on `build(kind, cfg)`'s model with each block and the root `fully_shard`ed
    in a gloo process group of one (started here, in memory, and ended after)."""
    import torch.distributed as dist

    from bench_common import two_group_adamw
    from watch_time import time_watch

    def sharded(kind: str, cfg: dict):
        model, _, batch_fn, loss_fn = build(kind, cfg)
        model = shard_blocks(model)
        return model, two_group_adamw(model), batch_fn, loss_fn

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return time_watch(sharded, kind, cfg, rounds, k)
    finally:
        dist.destroy_process_group()


def fsdp_lines(kind: str, r: dict, goal: float) -> list[tuple]:
    """The table rows of the FSDP2 figures, laid out as F's."""
    from watch_time import watch_lines

    return watch_lines(f"{kind} under FSDP2 (fully_shard, world 1, gloo)", r, goal)
