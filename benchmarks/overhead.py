"""What observing a training step costs: time, memory, and the time to build a report.

Run with the project's venv (`make bench`, or `.venv/bin/python benchmarks/overhead.py`).
Prints a table with each measured ratio beside its goal and writes everything to JSON.

  A. per-step time, plain vs observed, interleaved A B A B, medians over repeats, one torch
     thread, on (a) a GPT-style model (~17M parameters) and (b) a model with ~500 small tensors.
     "Observed" is an `Observer` built the way `diagkit.run.diagnose.pipeline.observe` builds it, and only the
     step itself (begin_step + the user's step + end_step) is timed; the one-off costs
     (inventory, Observer + attach, SavedState capture and restore, detach, steps table,
     judging) are timed separately and reported as fixed costs.
  B. peak memory (VmHWM) of each variant, each in a fresh subprocess.
  C. the time to build the tables, the findings and the report pieces (plots + tables HTML)
     for synthetic tables of 2,000 tensors x 200 steps.
  D. the steps table of a long run (2,000 tensors) observed every step vs every 100th.
  F. `diagkit.watch` in the user's own loop: watched vs plain steps, and after it detached
     (benchmarks/watch_time.py).
  G. the same on the GPT sharded by FSDP2 (`fully_shard`, world 1 on gloo) against that sharded
     model's plain step (benchmarks/fsdp_time.py).
  H. `import diagkit` over `import torch`, in the same fresh process (medians over a few
     processes), which heavy modules it loaded, and the first use of `diagkit.watch`.
  I. the whole-run watch (`steps=None, every=100`): the whole block's time against plain,
     its unobserved steps, the wiring check per step on 500 and 5,000 tensors, and peak RSS
     over a long run of a tiny model (benchmarks/whole_run_time.py).
  J. `diagkit.watch(engine)` on the GPT under a DeepSpeed ZeRO-3 engine (world 1 on gloo,
     DeepSpeed's CPU accelerator) against that engine's plain step (benchmarks/zero_time.py).
  K. the live view in a real Jupyter kernel: watch with and without it (live_time.py).
  L. the whole call: `diagnose(steps=10)` against 10 plain steps, fixed cost included, with an
     A/A control, and the fixed cost per call (whole_call_time.py).
  M. `diagkit.watch` under DDP and FSDP2 at world 2 (gloo, a process per rank) against the
     same engine's plain step (group_time.py).
  N. `diagkit check` of the 70B LLaMA + LoRA demo with `--meta`: wall time and peak RSS of a
     fresh process (meta_time.py).
  O. a LoRA fine-tune (r=8 on q/v, peft) of an 8-layer Llama: extra peak RSS per delta mode,
     watched step against plain (A/A control), and the 70B LoRA plan's snapshot bytes on meta
     (lora_time.py; issue 35).
  P. the GPT under `torch.compile` (inductor): watched step against plain (A/A control), a
     whole-run watch's observed and unobserved steps, and dynamo's counters before and after
     observing (compile_time.py; issue 35).
  E. with --device cuda: the ~350M-parameter GPT on the GPU (step ratio per delta mode, host
     syncs and device bytes allocated per observed step, peak device memory per mode).

Step time is measured for each delta mode (exact, sampled, off); the goal applies to exact.

Each section lives in `benchmarks/sections/` (its goal beside the code that measures and prints
it); what they share is `benchmarks/bench_common.py`. This file only runs them: it imports the
sections, and nothing imports it.

`--quick` shrinks everything to a few seconds (smoke use). `--only SECTION` (repeatable) runs
those sections alone (every other one skipped), e.g. `--only lora`. `--profile` adds a cProfile of the
observed step (the hot spots are printed and stored in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

from bench_common import SIZES, Bench  # noqa: E402
from sections import (call, compiled, fsdp, group, imports, live, lora, memory,  # noqa: E402
                      meta, report, step_time, stride, watch, whole, zero)

# The sections in the order they run, the order they ran in when they were one file.
RUN_ORDER = (step_time, call, watch, fsdp, group, zero, memory, report, stride, imports, whole,
             meta, lora, compiled, live)
# Their names, as --skip and --only take them.
SECTIONS = ["time", "watch", "fsdp", "zero", "memory", "report", "stride", "import", "whole",
            "live", "call", "group", "meta", "lora", "compile"]
# Every goal, as the JSON records them: each is defined in the section that judges it.
GOALS = {key: goal for section in (step_time, memory, report, imports, whole, zero, group, call)
         for key, goal in section.GOALS.items()}


def main(argv=None) -> int:
    """The CPU run (or a memory child, or the GPU run): each section not skipped, in order."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    ap.add_argument("--profile", action="store_true", help="cProfile the observed step")
    ap.add_argument("--out", default="out/bench.json", help="JSON output path")
    ap.add_argument("--skip", action="append", default=[], choices=SECTIONS)
    ap.add_argument("--only", action="append", default=[], choices=SECTIONS,
                    help="run only this section (repeatable): every other one is skipped")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the ~350M-parameter GPT variant on the GPU (time and memory)")
    ap.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.only:
        args.skip = sorted(set(args.skip) | (set(SECTIONS) - set(args.only)))

    if args.memory_child:
        spec = json.loads(args.memory_child)
        print(json.dumps(memory.memory_child(spec["kind"], spec["cfg"], spec["variant"],
                                             spec["steps"])))
        return 0

    if args.device == "cuda":
        return main_cuda(args)
    torch.set_num_threads(1)
    mode = "quick" if args.quick else "full"
    bench = Bench(sizes=SIZES[mode], mode=mode, out_path=Path(args.out), profile=args.profile)
    bench.result.update({
        "mode": mode,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "goals": GOALS,
    })
    started = time.perf_counter()
    for section in RUN_ORDER:
        if section.NAME in args.skip:
            continue
        needs = getattr(section, "NEEDS", None)
        if needs and importlib.util.find_spec(needs) is None:
            bench.lines.append(section.MISSING)
            continue
        with _guarded(bench, section.NAME):
            section.run(bench)
    bench.result["wall_s"] = time.perf_counter() - started
    _print_and_save(bench.result, bench.lines, bench.out_path, args.profile)
    return 0


@contextlib.contextmanager
def _guarded(bench: Bench, section: str):
    """One section of the bench: if it fails, its failure is a row of the table (and its
    traceback is on stderr), and the other sections still run; what was measured so far is
    written to `out_path` after every section, so a late failure loses nothing."""
    lines, result, out_path = bench.lines, bench.result, bench.out_path
    try:
        yield
    except Exception as exc:
        traceback.print_exc()
        lines.append((f"section {section!r} FAILED", f"{type(exc).__name__}: {exc}"[:300],
                      "-", "NOT met"))
        result.setdefault("failed_sections", []).append(section)
    finally:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.with_suffix(out_path.suffix + ".partial").write_text(
            json.dumps({**result, "lines": lines}, indent=1, default=str))


def main_cuda(args) -> int:
    """The ~350M-parameter GPT on the GPU: step time per mode, syncs, allocations, memory."""
    if not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    sz = SIZES["cuda"]
    bench = Bench(sizes=sz, mode="cuda", out_path=Path(args.out), profile=args.profile)
    result, lines = bench.result, bench.lines
    result.update({"mode": "cuda",
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "platform": platform.platform()},
                   "goals": GOALS})
    started = time.perf_counter()
    print("[time] gpt_large on cuda ...", file=sys.stderr, flush=True)
    r = step_time.time_steps("gpt_large", sz["gpt_large"], sz["rounds"]["gpt_large"],
                             sz["steps_per_block"]["gpt_large"], args.profile, device="cuda")
    result["step_time"] = {"gpt_large": r}
    lines += step_time.step_lines("gpt_large", r, step_time.GOALS["step_ratio_gpu"])
    print("[memory] gpt_large on cuda ...", file=sys.stderr, flush=True)
    m = memory.cuda_memory("gpt_large", sz["gpt_large"], sz["mem_steps"])
    result["memory"] = {"gpt_large": m}
    lines += memory.cuda_lines(m)
    if "import" not in args.skip:
        imports.run(bench)
    if "whole" not in args.skip:
        whole.run(bench)
    result["wall_s"] = time.perf_counter() - started
    _print_and_save(result, lines, bench.out_path, args.profile)
    return 0


def _print_and_save(result: dict, lines: list, out_path: Path, profile: bool) -> None:
    mode = result["mode"]
    if mode == "quick":  # the goals are for the full sizes: a smoke run judges nothing
        lines = [(*row[:3], "- (quick sizes)" if row[3] in ("met", "NOT met") else row[3])
                 for row in lines]

    widths = [max(len(row[i]) for row in lines) for i in range(4)] if lines else [0] * 4
    header = ("measure", "measured", "goal", "status")
    widths = [max(w, len(h)) for w, h in zip(widths, header)]
    where = (result["machine"].get("gpu") if mode == "cuda"
             else f"{result['machine']['cpus']} CPUs, 1 torch thread")
    print(f"diagkit overhead benchmark ({mode}, {result['date']}, {where}, "
          f"torch {torch.__version__})")
    for row in [header] + lines:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if profile and "step_time" in result:
        for kind, r in result["step_time"].items():
            prof = r.get("profile_top", {})
            print(f"\ncProfile of the observed step, {kind} (top by own time, per step):")
            for p in prof.get("by_own_time", []):
                print(f"  {p['tottime_ms_per_step']:8.2f} ms own {p['cumtime_ms_per_step']:8.2f}"
                      f" ms cum {p['calls_per_step']:8.0f} calls  {p['function']}")
            print(f"cProfile, {kind}: diagkit measuring functions by cumulative time, per step:")
            for p in prof.get("observer_by_cumtime", []):
                print(f"  {p['tottime_ms_per_step']:8.2f} ms own {p['cumtime_ms_per_step']:8.2f}"
                      f" ms cum {p['calls_per_step']:8.0f} calls  {p['function']}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(out_path)
    out_path.with_suffix(out_path.suffix + ".partial").unlink(missing_ok=True)  # (`_guarded`)
    print(f"\nwrote {out_path} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
