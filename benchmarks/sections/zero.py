"""J. `diagkit.watch(engine)` on the GPT under a DeepSpeed ZeRO-3 engine (world 1 on gloo,
DeepSpeed's CPU accelerator) against that engine's plain step (measured by
benchmarks/zero_time.py).
"""

from __future__ import annotations

from bench_common import Bench, gpt_engine_step

NAME = "zero"
GOALS = {"step_ratio_zero": 1.05}       # watch under a process group: issue 25's goal
NEEDS = "deepspeed"                     # without it, the row below instead of the figures
MISSING = ("DeepSpeed ZeRO-3 (J)", "skipped: deepspeed is not installed", "-", "-")


def run(bench: Bench) -> None:
    """The engine's watched step against its plain one (`result["zero_watch_time"]`)."""
    from zero_time import time_zero, zero_lines
    gpt_engine_step(bench, "zero_watch_time", time_zero, zero_lines, GOALS["step_ratio_zero"])
