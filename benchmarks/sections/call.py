"""L. The whole call: `diagnose(steps=10)` against 10 plain steps, fixed cost included, with an
A/A control, and the fixed cost per call (measured by benchmarks/whole_call_time.py).
"""

from __future__ import annotations

import sys

from bench_common import Bench, build

NAME = "call"
GOALS = {"whole_call_ratio": 1.05}      # diagnose(steps=10) / 10 plain steps, fixed cost in


def run(bench: Bench) -> None:
    """Both models' whole call beside the goal (`result["whole_call"]`)."""
    from whole_call_time import time_whole_call, whole_call_lines
    sz, lines = bench.sizes, bench.lines
    bench.result["whole_call"] = {}
    for kind in ("gpt", "small"):
        print(f"[call] {kind} ...", file=sys.stderr, flush=True)
        rounds, n = sz["call"][kind]
        r = bench.result["whole_call"][kind] = time_whole_call(build, kind, sz[kind], rounds, n)
        lines += whole_call_lines(kind, r, GOALS["whole_call_ratio"])
