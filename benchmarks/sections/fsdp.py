"""G. `diagkit.watch` on the GPT sharded by FSDP2 (`fully_shard`, world 1 on gloo) against that
sharded model's plain step (measured by benchmarks/fsdp_time.py).
"""

from __future__ import annotations

import sys

from bench_common import Bench, build
from sections.group import GOALS as GROUP_GOALS

NAME = "fsdp"
# The goal is M's, a step under a process group (issue 25).
GOALS: dict = {}


def run(bench: Bench) -> None:
    """The sharded GPT's watched step against its plain one (`result["fsdp_watch_time"]`)."""
    from fsdp_time import fsdp_lines, time_fsdp
    sz = bench.sizes
    print("[fsdp] gpt ...", file=sys.stderr, flush=True)
    r = time_fsdp(build, "gpt", sz["gpt"], sz["rounds"]["gpt"], sz["steps_per_block"]["gpt"])
    bench.result["fsdp_watch_time"] = {"gpt": r}
    bench.lines += fsdp_lines("gpt", r, GROUP_GOALS["step_ratio_group"])
