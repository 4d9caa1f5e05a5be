"""K. The live view in a real Jupyter kernel: watch with and without it (measured by
benchmarks/live_time.py; its rows' goal is "within noise").
"""

from __future__ import annotations

import sys

from bench_common import Bench

NAME = "live"
GOALS: dict = {}


def run(bench: Bench) -> None:
    """Both models in a kernel, and the panel's rate (`result["live_view"]`)."""
    from live_time import live_lines, time_live
    print("[live] gpt, small in a kernel ...", file=sys.stderr, flush=True)
    bench.result["live_view"] = time_live(bench.sizes, bench.mode)
    bench.lines += live_lines(bench.result["live_view"])
