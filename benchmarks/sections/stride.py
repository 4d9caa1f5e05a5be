"""D. The steps table of a long run (2,000 tensors) observed every step vs every 100th: bytes
per row in memory and on disk, projected to a 10,000-step run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import nn

from bench_common import Bench

NAME = "stride"
PROJECTED_STEPS = 10_000
# The goal: with every=k the projected table stays small, taken as under 64 MiB in memory.
SMALL_BYTES = 64 * 2**20


class ManyTiny(nn.Module):
    """`n` tensors of 4 elements: a long run's steps table is tensors x observed steps rows."""

    def __init__(self, n):
        super().__init__()
        self.ps = nn.ParameterList(nn.Parameter(torch.randn(4)) for _ in range(n))

    def forward(self, x):
        return (torch.stack(list(self.ps)) * x).square().mean()


def stride_tables(tensors: int, steps: int, every: int, full_steps: int, out_dir: Path) -> dict:
    """Steps-table size in memory and on disk, observing every step vs every k-th."""
    import diagkit

    torch.manual_seed(0)
    model = ManyTiny(tensors)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    x = torch.randn(tensors, 4)
    out = {"tensors": tensors}
    for label, n_steps, k in (("every_1", full_steps, 1), (f"every_{every}", steps, every)):
        t0 = time.perf_counter()
        diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=lambda m, b: m(b),
                                steps=n_steps, every=k, restore=False)
        seconds = time.perf_counter() - t0
        folder = out_dir / f"bench_stride_{label}"
        diag.save(folder)
        disk = sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("steps"))
        rows = len(diag.steps)
        out[label] = {"steps": n_steps, "every": k, "rows": rows, "seconds": seconds,
                      "memory_bytes": int(diag.steps.memory_usage(deep=True).sum()),
                      "disk_bytes": disk, "observed_steps": diag.meta["steps_observed"]}
    # Rows grow linearly with observed steps: project both to a 10,000-step run from the
    # bytes per row measured above (running 10,000 steps of 2,000 tensors takes minutes here).
    out["projected"] = {}
    for label in ("every_1", f"every_{every}"):
        run = out[label]
        rows = (PROJECTED_STEPS + run["every"] - 1) // run["every"] * tensors
        out["projected"][label] = {
            "steps": PROJECTED_STEPS, "rows": rows,
            "memory_bytes": run["memory_bytes"] / run["rows"] * rows,
            "disk_bytes": run["disk_bytes"] / run["rows"] * rows}
    return out



def run(bench: Bench) -> None:
    """One row per stride: the projected table's rows, memory and disk (`result["stride"]`)."""
    print("[stride] ...", file=sys.stderr, flush=True)
    cfg, lines = bench.sizes["stride"], bench.lines
    st = stride_tables(cfg["tensors"], cfg["steps"], cfg["every"], cfg["full_steps"],
                       bench.out_path.parent)
    bench.result["stride"] = st
    for label, run_ in st["projected"].items():
        real = st[label]
        lines.append((f"steps table, {st['tensors']} tensors x {PROJECTED_STEPS:,} steps, "
                      f"{label.replace('_', '=')}",
                      f"{run_['rows']:,} rows, {run_['memory_bytes'] / 2**20:.1f} MiB in memory, "
                      f"{run_['disk_bytes'] / 2**20:.1f} MiB parquet (bytes/row from a real "
                      f"{real['steps']}-step run: {real['rows']:,} rows, {real['seconds']:.0f} s)",
                      "small with every=k" if label != "every_1" else "-",
                      "met" if label != "every_1" and run_["memory_bytes"] < SMALL_BYTES
                      else "-"))
