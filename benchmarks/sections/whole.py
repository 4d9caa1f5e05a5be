"""I. The whole-run watch (`steps=None, every=100`): the whole block's time against plain, its
unobserved steps, the wiring check per step on 500 and 5,000 tensors, and peak RSS over a long
run of a tiny model (measured by benchmarks/whole_run_time.py).
"""

from __future__ import annotations

import sys

from bench_common import Bench, build

NAME = "whole"
GOALS = {
    "whole_run_ratio": 1.01,            # steps=None, every=100, over the run
    # Wiring.changes on 5,000 tensors / a plain step (issue 25); the rows judge it by
    # whole_run_time.CHECK_GOAL, the same figure.
    "change_check_fraction": 0.002,
}


def run(bench: Bench) -> None:
    """Both models' whole-run blocks, the wiring check, the long run's memory (kept in
    `result["whole_run"]`); on the CPU and the GPU run alike."""
    from whole_run_time import (long_run_memory, time_change_check, time_whole_run,
                                whole_run_lines)
    sz = bench.sizes
    cfg, r = sz["whole"], {"time": {}}
    for kind in ("gpt", "small"):
        print(f"[whole] {kind} ...", file=sys.stderr, flush=True)
        rounds, n = cfg[kind]
        r["time"][kind] = time_whole_run(build, kind, sz[kind], rounds, n, cfg["every"])
    r["check"] = [time_change_check(t) for t in cfg["check"]]
    print("[whole] long run ...", file=sys.stderr, flush=True)
    r["memory"] = long_run_memory(cfg["long_steps"])
    bench.result["whole_run"] = r
    bench.lines += whole_run_lines(r, GOALS["whole_run_ratio"])
