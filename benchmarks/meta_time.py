"""The 70B dry run on meta (issue 25): `diagkit check diagkit.demos.llama_lora:llama_lora
--meta` as a user runs it, a fresh process each time, its wall time and peak RSS.

Measured as docs/meta.md, "Dry run on meta" states its figures: `/usr/bin/time -v` around the
venv's `diagkit` script (the process's own `Maximum resident set size`: time forks from its
own small process, so the parent's RSS is not carried into the child's, the caveat of
section B). Without `/usr/bin/time` the child reads its own `VmHWM` instead. Where the seconds
go: benchmarks/README.md, "The 70B meta check (issue 25)".
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMAND = ["check", "diagkit.demos.llama_lora:llama_lora", "--meta"]
GOAL_SECONDS = 10.0
GOAL_BYTES = 500 * 10**6  # "< 500 MB": decimal megabytes, the stricter reading
TIME = Path("/usr/bin/time")
# The fallback: the CLI in this interpreter, then its own peak from /proc (KiB) on stderr.
_SELF_PEAK = """
import sys
from diagkit.run.cli.commands import main
try:
    code = main(sys.argv[1:])
finally:
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")]
    print("PEAK_KIB", hwm[0].split()[1] if hwm else -1, file=sys.stderr)
sys.exit(code)
"""


def time_meta(runs: int = 3, timeout: float = 300) -> dict:
    """Medians of `runs` fresh runs of the 70B meta check: wall seconds and peak RSS bytes,
    with every run's figures kept. Each must exit 1 (its orphans are errors): a run that
    fails otherwise has measured nothing, and raises."""
    walls, peaks = [], []
    for _ in range(runs):
        wall, peak = _one_run(timeout)
        walls.append(wall)
        peaks.append(peak)
    return {"runs": runs, "command": "diagkit " + " ".join(COMMAND),
            "how": "/usr/bin/time -v" if TIME.exists() else "VmHWM",
            "wall_s": statistics.median(walls), "peak_rss_bytes": statistics.median(peaks),
            "wall_s_each": walls, "peak_rss_bytes_each": peaks}


def _one_run(timeout: float) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one fresh process of the check."""
    script = Path(sys.executable).with_name("diagkit")
    if TIME.exists() and script.exists():
        cmd = [str(TIME), "-v", str(script), *COMMAND]
    else:
        cmd = [sys.executable, "-c", _SELF_PEAK, *COMMAND]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - started
    if done.returncode != 1:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}, not 1 (its orphans): "
                           f"{done.stderr[-2000:]}")
    return _read(done.stderr, wall)


def _read(stderr: str, wall: float) -> tuple[float, int]:
    """The figures from `/usr/bin/time -v`'s report (its elapsed time, the child's maximum
    RSS in KiB), else the fallback's PEAK_KIB line with the wall time measured here."""
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    if rss:
        elapsed = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", stderr)
        h, m, s = elapsed.groups()
        return int(h or 0) * 3600 + int(m) * 60 + float(s), int(rss.group(1)) * 1024
    return wall, int(re.search(r"PEAK_KIB (-?\d+)", stderr).group(1)) * 1024


def meta_lines(result: dict) -> list[tuple[str, str, str, str]]:
    """The table rows (measure, measured, goal, status) of the 70B meta check."""
    wall, peak, runs = result["wall_s"], result["peak_rss_bytes"], result["runs"]
    each = ", ".join(f"{w:.1f}" for w in result["wall_s_each"])
    return [
        ("70B LLaMA + LoRA `check --meta`, wall time", f"{wall:.1f} s (median of {runs}: "
         f"{each} s)", f"< {GOAL_SECONDS:.0f} s", "met" if wall < GOAL_SECONDS else "NOT met"),
        ("70B LLaMA + LoRA `check --meta`, peak RSS", f"{peak / 1e6:.0f} MB "
         f"({peak / 2**20:.0f} MiB, {result['how']})", f"< {GOAL_BYTES // 10**6} MB",
         "met" if peak < GOAL_BYTES else "NOT met"),
    ]


if __name__ == "__main__":
    for row in meta_lines(time_meta()):
        print(" | ".join(row))
