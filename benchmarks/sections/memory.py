"""B. Peak memory of each variant (plain, observe, sampled, off, diagnose), each in a fresh
subprocess (VmHWM: its own address space's peak), and E's peak device memory per mode.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

from bench_common import Bench, build, mark, param_facts, setup_of

NAME = "memory"
GOALS = {
    "extra_memory_per_param_byte": 1.0,   # plus a small constant
    "memory_constant_mb": 64.0,           # what "a small constant" is taken to be here
}
# A child is the runner itself, `--_memory-child SPEC`: it imports what the runner imports, as
# a child always did (a path, not an import: nothing imports the runner).
RUNNER = Path(__file__).resolve().parents[1] / "overhead.py"


def memory_child(kind: str, cfg: dict, variant: str, steps: int) -> dict:
    """Runs in a fresh interpreter: build, one warm-up plain step, then `steps` steps of the
    variant; report the peak resident set (ru_maxrss, KiB on Linux)."""
    torch.set_num_threads(1)
    import diagkit
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.diagnose.pipeline import observe

    model, opt, batch_fn, loss_fn = build(kind, cfg)
    setup = setup_of(model, opt, batch_fn, loss_fn)
    step = step_function(setup)
    step(0)  # AdamW state and .grad exist, as in the middle of a training run
    warm_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    warm_hwm = _vm_hwm_kib()
    if variant == "plain":
        for i in range(steps):
            step(i)
    elif variant == "observe":  # hooks + observer only: exact mode, no restore copies
        observe(setup, steps, restore=False)
    elif variant in ("sampled", "off"):  # the bounded modes, no restore copies
        observe(setup, steps, restore=False, delta=variant)
    elif variant == "diagnose":  # what users call: restore=True, then judging
        diagkit.diagnose(model, opt, batch_fn=batch_fn, loss_fn=loss_fn, steps=steps)
    else:
        raise SystemExit(f"unknown variant {variant}")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "ru_maxrss_kib": peak_kib, "ru_maxrss_after_warmup_kib": warm_kib,
            "hwm_kib": _vm_hwm_kib(), "hwm_after_warmup_kib": warm_hwm,
            "peak_kib": _vm_hwm_kib() or peak_kib,
            "param_bytes": param_facts(model)["bytes"]}


def _vm_hwm_kib() -> int | None:
    """This process's own peak RSS. Linux carries ru_maxrss across fork+exec (a child spawned
    by a 1 GiB parent reports >= 1 GiB), while VmHWM belongs to the new address space."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


MEMORY_VARIANTS = ("plain", "observe", "sampled", "off", "diagnose")


def measure_memory(kind: str, cfg: dict, steps: int, repeats: int = 3) -> dict:
    """Peak RSS per variant, each run in its own fresh interpreter, `repeats` times.

    The lowest peak of the repeats is kept: a peak can only be pushed up by the allocator's
    slack (malloc arenas, fragmentation: +-20 MiB between runs of the same variant), never
    below what the variant needs, so the minimum is the steadiest estimate.
    """
    runs: dict[str, list[dict]] = {v: [] for v in MEMORY_VARIANTS}
    for _ in range(repeats):
        # The variants of one repeat run side by side (peak RSS is per process).
        procs = {variant: subprocess.Popen(
            [sys.executable, str(RUNNER), "--_memory-child",
             json.dumps({"kind": kind, "cfg": cfg, "variant": variant, "steps": steps})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for variant in MEMORY_VARIANTS}
        for variant, proc in procs.items():
            stdout, stderr = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {kind}/{variant} failed:\n{stderr[-3000:]}")
            runs[variant].append(json.loads(stdout.strip().splitlines()[-1]))
    out = {variant: {**min(rs, key=lambda r: r["peak_kib"]),
                     "peak_kib_all": [r["peak_kib"] for r in rs]}
           for variant, rs in runs.items()}
    param_bytes = out["plain"]["param_bytes"]
    base = out["plain"]["peak_kib"] * 1024
    for variant in MEMORY_VARIANTS[1:]:
        extra = out[variant]["peak_kib"] * 1024 - base
        out[variant]["extra_bytes"] = extra
        out[variant]["extra_per_param_byte"] = extra / param_bytes
    return out


def cuda_memory(kind: str, cfg: dict, steps: int) -> dict:
    """Peak device memory of each variant, in this process (the allocator's own peak)."""
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.diagnose.pipeline import observe

    model, opt, batch_fn, loss_fn = build(kind, cfg, "cuda")
    setup = setup_of(model, opt, batch_fn, loss_fn)
    step = step_function(setup)
    step(0)
    out = {"param_bytes": param_facts(model)["bytes"]}
    for variant in ("plain", "exact", "sampled", "off"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        if variant == "plain":
            for i in range(steps):
                step(i)
        else:
            observe(setup, steps, restore=False, delta=variant)
        torch.cuda.synchronize()
        out[variant] = torch.cuda.max_memory_allocated() - base
    for variant in ("exact", "sampled", "off"):
        out[f"{variant}_extra_bytes"] = out[variant] - out["plain"]
        out[f"{variant}_extra_per_param_byte"] = out[f"{variant}_extra_bytes"] / out["param_bytes"]
    return out


LABELS = {"observe": "exact (restore=False)", "sampled": "sampled (restore=False)",
          "off": "off (restore=False)",
          "diagnose": "diagnose, exact + restore=True (host copies, by design)"}


def run(bench: Bench) -> None:
    """Both models' extra peak per variant beside the goal; `diagnose` (restore=True keeps
    host copies by design) is shown, not judged (`result["memory"]`)."""
    sz, lines = bench.sizes, bench.lines
    bench.result["memory"] = {}
    for kind in ("gpt", "small"):
        print(f"[memory] {kind} ...", file=sys.stderr, flush=True)
        m = measure_memory(kind, sz[kind], sz["mem_steps"], repeats=1 if bench.quick else 3)
        bench.result["memory"][kind] = m
        pb = m["plain"]["param_bytes"]
        const = GOALS["memory_constant_mb"] * 2**20
        for variant, label in LABELS.items():
            extra = m[variant]["extra_bytes"]
            goal_bytes = GOALS["extra_memory_per_param_byte"] * pb + const
            if variant == "diagnose":
                goal_text, status = "- (restore copies values, grads, optimizer state)", "-"
            else:
                goal_text = f"<= 1.0x params + {GOALS['memory_constant_mb']:.0f} MiB"
                status = mark(extra, goal_bytes)
            lines.append((f"extra peak RSS, {kind}, {label}",
                          f"{extra / 2**20:.1f} MiB = {m[variant]['extra_per_param_byte']:.2f}"
                          f"x params ({pb / 2**20:.1f} MiB; plain peak "
                          f"{m['plain']['peak_kib'] / 1024:.0f} MiB, VmHWM, lowest of "
                          f"{len(m['plain']['peak_kib_all'])} runs)",
                          goal_text, status))


def cuda_lines(m: dict) -> list[tuple]:
    """E: the extra peak device memory per mode (`cuda_memory`'s figures) beside the goal."""
    lines = []
    for variant in ("exact", "sampled", "off"):
        extra = m[f"{variant}_extra_bytes"]
        lines.append((f"extra peak device memory, gpt_large, delta={variant}",
                      f"{extra / 2**20:.1f} MiB = {m[f'{variant}_extra_per_param_byte']:.3f}x params "
                      f"({m['param_bytes'] / 2**30:.2f} GiB)",
                      f"<= 1.0x params + {GOALS['memory_constant_mb']:.0f} MiB",
                      mark(extra, m["param_bytes"] + GOALS["memory_constant_mb"] * 2**20)))
