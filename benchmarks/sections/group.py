"""M. `diagkit.watch` under DDP and FSDP2 at world 2 (gloo, a process per rank) against the same
engine's plain step (measured by benchmarks/group_time.py).
"""

from __future__ import annotations

import sys

from bench_common import Bench

NAME = "group"
GOALS = {"step_ratio_group": 1.05}      # DDP / FSDP2 under a process group (issue 25)


def run(bench: Bench) -> None:
    """Each engine's watched step against its plain one, rank 0's figures
    (`result["group_watch_time"]`)."""
    from group_time import ENGINES, group_lines, time_group
    sz, lines = bench.sizes, bench.lines
    bench.result["group_watch_time"] = {}
    for engine in ENGINES:
        print(f"[group] gpt under {engine}, world 2 ...", file=sys.stderr, flush=True)
        r = time_group(engine, "gpt", sz["gpt"], sz["rounds"]["group"],
                       sz["steps_per_block"]["gpt"])
        bench.result["group_watch_time"][engine] = r
        lines += group_lines("gpt", r, GOALS["step_ratio_group"])
