"""P. The GPT under `torch.compile` (inductor): watched step against plain (A/A control), a
whole-run watch's observed and unobserved steps, and dynamo's counters before and after
observing (measured by benchmarks/compile_time.py; issue 35).
"""

from __future__ import annotations

import sys

from bench_common import Bench, build
from sections.step_time import GOALS as STEP_GOALS

NAME = "compile"
# The goal is A's for the GPT: a compiled step observed / plain is judged as an eager one.
GOALS: dict = {}


def run(bench: Bench) -> None:
    """The compiled GPT's figures (`result["compile"]`)."""
    from compile_time import compile_lines, time_compiled
    print("[compile] the GPT under torch.compile ...", file=sys.stderr, flush=True)
    bench.result["compile"] = time_compiled(build, bench.sizes["gpt"],
                                            rounds=2 if bench.quick else 5)
    bench.lines += compile_lines(bench.result["compile"], STEP_GOALS["step_ratio_gpt"])
