"""M. `diagkit.watch` under a process group of two: DDP and FSDP2 at world 2 (gloo, one torch
thread per rank), per-step time watched vs the same engine's plain step, measured as in F
(`watch_time.time_watch`) on every rank in lockstep (the collectives keep the ranks together);
rank 0's figures are reported.

Under a process group every tensor stays hooked (no share is earned: the .grad the optimizer
sees is the reduced gradient, not this rank's own), each rank measures its own tensors or
shards, one all-reduce per observed step combines what must be combined, and each observed
step is published to the group's store for rank 0. Two ranks on this 2-core machine take a
core each: nothing else may run beside this section.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ENGINES = ("ddp", "fsdp2")


def _wrapped(engine: str):
    """A `build(kind, cfg)` that returns the model wrapped by `engine`, and its AdamW."""
    from fsdp_time import shard_blocks
    from bench_common import build, two_group_adamw

    def wrapped(kind: str, cfg: dict):
        model, _, batch_fn, loss_fn = build(kind, cfg)
        if engine == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model)
        else:
            model = shard_blocks(model)
        return model, two_group_adamw(model), batch_fn, loss_fn

    return wrapped


def _rank(rank: int, world: int, init: str, engine: str, kind: str, cfg: dict, rounds: int,
          k: int, out: str) -> None:
    """One rank: join the group, run F's measurement, rank 0 writes its figures to `out`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        from watch_time import time_watch
        r = time_watch(_wrapped(engine), kind, cfg, rounds, k)
        if rank == 0:
            Path(out).write_text(json.dumps(r))
    finally:
        dist.destroy_process_group()


def time_group(engine: str, kind: str, cfg: dict, rounds: int, k: int, world: int = 2) -> dict:
    """F's figures for `engine` at `world` ranks, from rank 0; every rank is joined (or ended)
    before this returns, so no process outlives it."""
    import torch.multiprocessing as mp

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    with tempfile.TemporaryDirectory(prefix="diagkit-bench-group-") as tmp:
        init, out = f"file://{os.path.join(tmp, 'init')}", os.path.join(tmp, "rank0.json")
        ctx = mp.start_processes(_rank, args=(world, init, engine, kind, cfg, rounds, k, out),
                                 nprocs=world, join=False, start_method="spawn")
        try:
            while not ctx.join():
                pass
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                p.join()
        return {**json.loads(Path(out).read_text()), "world": world, "engine": engine}


def group_lines(kind: str, r: dict, goal: float) -> list[tuple]:
    """The table rows of one engine's figures, laid out as F's."""
    from watch_time import watch_lines

    name = {"ddp": "DDP", "fsdp2": "FSDP2 (fully_shard)"}[r["engine"]]
    return watch_lines(f"{kind} under {name}, world {r['world']}, gloo", r, goal)
