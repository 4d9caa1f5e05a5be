"""N. `diagkit check` of the 70B LLaMA + LoRA demo with `--meta`: wall time and peak RSS of a
fresh process (measured by benchmarks/meta_time.py, whose GOAL_SECONDS and GOAL_BYTES sit
beside the rows that judge them).
"""

from __future__ import annotations

import sys

from bench_common import Bench

NAME = "meta"
GOALS: dict = {}                        # meta_time.GOAL_SECONDS, meta_time.GOAL_BYTES
NEEDS = "transformers"
MISSING = ("the 70B meta check (N)", "skipped: transformers is not installed", "-", "-")


def run(bench: Bench) -> None:
    """The check's wall time and peak beside their goals (`result["meta"]`)."""
    from meta_time import meta_lines, time_meta
    print("[meta] the 70B LLaMA + LoRA demo, --meta ...", file=sys.stderr, flush=True)
    bench.result["meta"] = time_meta(runs=1 if bench.quick else 3)
    bench.lines += meta_lines(bench.result["meta"])
