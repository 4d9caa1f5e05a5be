"""G. `diagkit.watch` on the GPT sharded by FSDP2 (`fully_shard`, world 1 on gloo) against that
sharded model's plain step (measured by benchmarks/fsdp_time.py).
"""

from __future__ import annotations

from bench_common import Bench, gpt_engine_step
from sections.group import GOALS as GROUP_GOALS

NAME = "fsdp"
# The goal is M's, a step under a process group (issue 25).
GOALS: dict = {}


def run(bench: Bench) -> None:
    """The sharded GPT's watched step against its plain one (`result["fsdp_watch_time"]`)."""
    from fsdp_time import fsdp_lines, time_fsdp
    gpt_engine_step(bench, "fsdp_watch_time", time_fsdp, fsdp_lines,
                    GROUP_GOALS["step_ratio_group"])
