"""H. `import diagkit` over `import torch`, in the same fresh process (medians over a few
processes), which heavy modules it loaded, and the first use of `diagkit.watch`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from bench_common import Bench, mark

NAME = "import"
GOALS = {"import_seconds_over_torch": 1.0}   # import diagkit, after import torch
# What `import diagkit` must not load (its names load on first use).
HEAVY = ("pandas", "pyarrow", "matplotlib", "ipywidgets", "papermill", "torch.distributed.tensor")

_IMPORT_CHILD = """
import json, sys, time
t0 = time.perf_counter(); import torch
t1 = time.perf_counter(); import diagkit
t2 = time.perf_counter(); loaded = [m for m in HEAVY if m in sys.modules]
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch loads torch._dynamo
t3 = time.perf_counter(); diagkit.watch
t4 = time.perf_counter()
print(json.dumps({"torch_s": t1 - t0, "diagkit_s": t2 - t1, "first_optimizer_s": t3 - t2,
                  "watch_first_use_s": t4 - t3, "loaded_by_import": loaded}))
"""


def time_import(runs: int) -> dict:
    """H: each run a fresh interpreter (nothing cached in sys.modules, the OS file cache warm
    after the first): `import torch`, then `import diagkit`, then, as in a program that built
    its optimizer (torch's first optimizer imports torch._dynamo and DTensor itself), the
    first use of `diagkit.watch`."""
    child = f"HEAVY = {HEAVY!r}\n" + _IMPORT_CHILD
    got = [json.loads(subprocess.run([sys.executable, "-c", child], capture_output=True,
                                     text=True, check=True).stdout) for _ in range(runs + 1)]
    got = got[1:]  # the first run warms the file cache
    med = {k: statistics.median(g[k] for g in got)
           for k in ("torch_s", "diagkit_s", "first_optimizer_s", "watch_first_use_s")}
    return {**med, "runs": len(got), "loaded_by_import": got[-1]["loaded_by_import"],
            "all": got}


def run(bench: Bench) -> None:
    """The same on the CPU and the GPU run: `import diagkit` over `import torch`, what it
    loads, and the first use of `diagkit.watch` (kept in `result["import"]`)."""
    print("[import] ...", file=sys.stderr, flush=True)
    imp = bench.result["import"] = time_import(bench.sizes["import_runs"])
    goal = GOALS["import_seconds_over_torch"]
    bench.lines.extend([
        ("import diagkit, over import torch (same process)",
         f"{imp['diagkit_s']:.3f} s (import torch {imp['torch_s']:.2f} s; medians "
         f"of {imp['runs']} fresh processes)", f"< {goal:.0f} s", mark(imp["diagkit_s"], goal)),
        ("  heavy modules loaded by import diagkit",
         ", ".join(imp["loaded_by_import"]) or "none", "none",
         "met" if not imp["loaded_by_import"] else "NOT met"),
        ("  first use of diagkit.watch, after the first optimizer was built",
         f"{imp['watch_first_use_s']:.2f} s (the observing code, pandas; the "
         f"optimizer itself {imp['first_optimizer_s']:.2f} s)", "-", "-")
    ])
