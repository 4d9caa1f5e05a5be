"""F. `diagkit.watch` in the user's own loop: watched vs plain steps, and after it detached
(measured by benchmarks/watch_time.py).
"""

from __future__ import annotations

import sys

from bench_common import Bench, build
from sections.step_time import GOALS as STEP_GOALS

NAME = "watch"
# The goal is A's, one step observed / plain (issue 25): a watched step is judged as one.
GOALS: dict = {}


def run(bench: Bench) -> None:
    """Both models' watched, plain and after-detach steps (`result["watch_time"]`)."""
    from watch_time import time_watch, watch_lines
    sz, lines = bench.sizes, bench.lines
    bench.result["watch_time"] = {}
    for kind in ("gpt", "small"):
        print(f"[watch] {kind} ...", file=sys.stderr, flush=True)
        r = time_watch(build, kind, sz[kind], sz["rounds"][kind], sz["steps_per_block"][kind])
        bench.result["watch_time"][kind] = r
        lines += watch_lines(kind, r, STEP_GOALS[f"step_ratio_{kind}"])
