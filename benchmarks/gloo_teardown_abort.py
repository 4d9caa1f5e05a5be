"""Reproduce the SIGABRT at a gloo rank's teardown ("terminate called without an active
exception") without diagkit: a minimal 2-rank job under torchrun, run N times per variant.

Each rank only imports what its variant names, joins a gloo group, does one all_reduce, and
destroys the group (`--ending no-destroy`: leaves it alive to the exit); nothing of diagkit
runs (`parquet`: pandas also writes a small parquet file before the group is destroyed, as
saving a diagnosis does). The abort comes after the rank's last line, at interpreter exit.
Prints, per variant, how many of the jobs had a rank abort. The cause found: a group left
alive to the exit (here 4 of 20 jobs of `--variant none --ending no-destroy` aborted, 0 of 20
with `--ending destroy`).

    .venv/bin/python benchmarks/gloo_teardown_abort.py --runs 20 --variant none --ending no-destroy
    .venv/bin/python benchmarks/gloo_teardown_abort.py --runs 40              # every variant
    .venv/bin/python benchmarks/gloo_teardown_abort.py --variant none --ending no-destroy --gdb

`--gdb` runs each rank under gdb and prints the aborting thread's stack and every thread's
when a rank aborts (docs/development.md, "Tests": what is known of this abort).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK = """
import sys
for name in sys.argv[1].split(",") if sys.argv[1] != "none" else ():
    __import__(name)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if len(sys.argv) > 3:  # write a parquet file, as a saved diagnosis does (Arrow's threads)
    import pandas as pd
    pd.DataFrame({"x": range(1000)}).to_parquet(f"{sys.argv[3]}.{dist.get_rank()}.parquet")
if sys.argv[2] == "destroy":
    dist.destroy_process_group()
print("rank", dist.get_rank() if dist.is_initialized() else "-", "done", flush=True)
"""
VARIANTS = {"none": "none", "pandas": "pandas", "pyarrow": "pyarrow",
            "pyarrow.compute": "pyarrow.compute", "diagkit": "diagkit", "parquet": "pandas"}
ABORT = "terminate called without an active exception"


def one_job(rank_py: Path, variant: str, ending: str, gdb: bool) -> tuple[bool, str]:
    """One torchrun of 2 ranks; (a rank aborted, the job's output)."""
    python = [sys.executable, "-u", str(rank_py), VARIANTS[variant], ending]
    if variant == "parquet":
        python.append(str(rank_py.with_name("table")))
    if gdb:
        python = ["gdb", "-q", "-batch", "-return-child-result", "-ex", "set pagination off",
                  "-ex", "run", "-ex", "bt", "-ex", "thread apply all bt 12", "--args", *python]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=0", "--no-python", *python]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    output = done.stdout + done.stderr
    aborted = ABORT in output or "SIGABRT" in output or bool(
        re.search(r"exitcode\s*:\s*-6", output))
    return aborted, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    parser.add_argument("--ending", choices=["destroy", "no-destroy"], default="destroy",
                        help="destroy the process group before exiting, or leave it to exit")
    parser.add_argument("--gdb", action="store_true", help="each rank under gdb; print stacks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rank_py = Path(tmp) / "rank.py"
        rank_py.write_text(RANK)
        for variant in args.variant or list(VARIANTS):
            aborts, started = 0, time.monotonic()
            for i in range(args.runs):
                aborted, output = one_job(rank_py, variant, args.ending, args.gdb)
                aborts += aborted
                if aborted and args.gdb:
                    print(f"--- {variant}, job {i}: a rank aborted\n{output[-12000:]}")
            print(f"{variant:16s} {args.ending:10s} {aborts:3d} of {args.runs} jobs had a rank "
                  f"abort ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
