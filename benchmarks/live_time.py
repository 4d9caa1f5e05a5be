"""K. The live view (docs/workbook.md, "The live view"), in a real Jupyter kernel (started here
with jupyter_client; its widget messages go out over IOPub as they would to JupyterLab):

- **loop cost**: the bench models' step time under a watch that shows the live panel, against
  the same watch without it. Interleaved as in F (`watch_time.timed_steps`): per round, a
  block of steps under `watch(..., live=False)` and one under `watch(..., live=True)`, in
  alternating order; the first and last step of each block (set-up, judging) are left out.
- **how often the panel moves**: a 50-step watch of a ~65 ms step (the small model, twice as
  deep); the panel's status widget's value changes are counted as the kernel sets them (each
  is one message to the front end), and the distinct step counts it showed before the end.
- **after the end**: the same watch, then 150 more steps in the same cell (the loop goes on
  past `steps`), with and without the panel: the total time of those 150 steps. The explorer
  was built on the feed's thread there, which holds the GIL.

    python benchmarks/live_time.py [--quick] [--src DIR] [--only cost|rate]
                                            # or as section K of overhead.py

`--src DIR`: import diagkit from DIR (another checkout's `src/`) in the kernel: the figures
before a change, on the same machine.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

KERNEL_CODE = """
import json, re, statistics, sys, time
sys.path.insert(0, {here!r})
if {src!r}:
    sys.path.insert(0, {src!r})
import torch
torch.set_num_threads(1)
import diagkit
from bench_common import build
from watch_time import timed_steps

med = statistics.median
out = {{"diagkit": diagkit.__file__}}


def stepper(model, opt, batch_fn, loss_fn):
    def step(_i):
        opt.zero_grad()
        loss_fn(model, batch_fn()).backward()
        opt.step()
    return step


for kind, cfg, rounds, k in {plan!r}:
    model, opt, batch_fn, loss_fn = build(kind, cfg)
    step = stepper(model, opt, batch_fn, loss_fn)
    timed_steps(step, 3)  # warm-up: allocator, optimizer state
    blocks = {{False: [], True: []}}
    ratios, updates, busy = [], 0, 0.0
    for r in range(rounds):
        medians = {{}}
        for live in ([False, True] if r % 2 == 0 else [True, False]):
            w = diagkit.watch(model, opt, steps=k + 2, live=live)
            times = timed_steps(step, k + 2)
            if live:
                assert w.live is not None and w.live.join(60), "no live view in the kernel"
                updates, busy = updates + w.live.updates, busy + w.live.busy
            blocks[live] += times[1:-1]
            medians[live] = med(times[1:-1])
        ratios.append(medians[True] / medians[False])
    out[kind] = {{"rounds": rounds, "steps_per_block": k, "without_s": med(blocks[False]),
                 "with_s": med(blocks[True]), "ratio_of_medians": med(blocks[True]) /
                 med(blocks[False]), "median_of_round_ratios": med(ratios),
                 "round_ratios": ratios, "updates": updates, "feed_busy_s": busy}}

cfg, rounds, n, after = {rate!r}


def rate_part():
    model, opt, batch_fn, loss_fn = build("small", cfg)
    step = stepper(model, opt, batch_fn, loss_fn)
    timed_steps(step, 3)
    rate = {{"rounds": rounds, "steps": n, "after": after, "moves": [], "seconds": [],
            "judged": [], "busy_s": [], "step_s": [], "after_ratio": [], "first_ratio": [],
            "after_s": {{}}}}
    totals, firsts = {{False: [], True: []}}, {{False: [], True: []}}
    for r in range(rounds):
        for live in ([False, True] if r % 2 == 0 else [True, False]):
            shown = []
            w = diagkit.watch(model, opt, steps=n, live=live)
            if live:
                w.live.panel.status.observe(lambda c: shown.append(c["new"]), names="value")
            start = time.perf_counter()
            times = timed_steps(step, n)
            watch_s = time.perf_counter() - start
            assert w.done
            rest = timed_steps(step, after)  # the loop goes on in the same cell
            totals[live].append(sum(rest))
            firsts[live].append(sum(rest[:20]))  # where the explorer used to be built
            if live:
                counts = {{int(m.group(1)) for s in shown
                          if (m := re.search(r"(\\d+) of %d steps observed" % n, s))}}
                rate["moves"].append(len({{c for c in counts if c < n}}))
                rate["seconds"].append(watch_s)
                rate["step_s"].append(med(times))
                w.live.join(60)
                rate["judged"].append(getattr(w.live, "judged", None))
                rate["busy_s"].append(w.live.busy)
        rate["after_ratio"].append(totals[True][-1] / totals[False][-1])
        rate["first_ratio"].append(firsts[True][-1] / firsts[False][-1])
    rate["after_s"] = {{"without": med(totals[False]), "with": med(totals[True])}}
    from diagkit.present.explorer import explore
    start = time.perf_counter()
    explore(w.diagnosis)  # what the feed's thread used to build while the loop went on
    rate["explorer_s"] = time.perf_counter() - start
    return rate


if rounds:
    out["rate"] = rate_part()
print("LIVE-RESULT " + json.dumps(out))
"""

PLANS = {"full": [("gpt", "gpt", 7, 8), ("small", "small", 9, 40)],
         "quick": [("gpt", "gpt", 2, 4), ("small", "small", 2, 10)]}
# (the model's config, rounds, steps of the watch, steps after it): the small model twice as
# deep steps in ~65 ms here
RATE = {"full": (dict(blocks=500, width=64, batch=32), 5, 50, 150),
        "quick": (dict(blocks=50, width=32, batch=8), 2, 50, 30)}


def time_live(sizes: dict, mode: str, src: str = "", only: str = "") -> dict:
    """Run the rounds in a fresh kernel; its result, by model, and the panel's rate. `only`:
    "cost" (the loop with and without the panel) or "rate" (how often it moves, and the
    steps after the end)."""
    from jupyter_client.manager import start_new_kernel
    plan = [(kind, sizes[key], rounds, k) for kind, key, rounds, k in PLANS[mode]
            if only != "rate"]
    rate = RATE[mode] if only != "cost" else (RATE[mode][0], 0, 0, 0)
    km, kc = start_new_kernel(kernel_name="python3")
    found, errors = [], []

    def output(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream" and "LIVE-RESULT " in content["text"]:
            found.append(content["text"].split("LIVE-RESULT ", 1)[1])
        elif msg["msg_type"] == "error":
            errors.append("\n".join(content["traceback"])[-3000:])

    try:
        code = KERNEL_CODE.format(here=str(HERE), src=src, plan=plan, rate=rate)
        kc.execute_interactive(textwrap.dedent(code), output_hook=output, timeout=3600)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    if errors or not found:
        raise RuntimeError(f"the kernel's run failed: {errors or 'no result printed'}")
    return json.loads(found[0])


def live_lines(r: dict) -> list[tuple]:
    """The table rows (measure, measured, goal, status)."""
    import statistics
    rows = []
    for kind, x in r.items():
        if kind in ("rate", "diagkit"):
            continue
        rows.append((f"step time with/without the live view, {kind} (a real kernel)",
                     f"{x['ratio_of_medians']:.3f}x (without {1e3 * x['without_s']:.1f} ms, "
                     f"with {1e3 * x['with_s']:.1f} ms; per-round median "
                     f"{x['median_of_round_ratios']:.3f}x; {x['updates']} updates, feed "
                     f"{1e3 * x['feed_busy_s']:.0f} ms in all)", "within noise", "-"))
    rate = r.get("rate")
    if rate is None:
        return rows
    per_s = [m / s for m, s in zip(rate["moves"], rate["seconds"])]
    rows.append((f"the panel's moves during a {rate['steps']}-step watch (distinct step counts "
                 f"shown before the end)",
                 f"{rate['moves']} in {[round(s, 2) for s in rate['seconds']]} s (median "
                 f"{statistics.median(per_s):.2f}/s; step "
                 f"{1e3 * statistics.median(rate['step_s']):.0f} ms; judged "
                 f"{rate['judged']} times)", ">= 1 a second", "-"))
    rows.append(("the first 20 steps after the watch ended, with/without the panel (total "
                 "time)", f"{statistics.median(rate['first_ratio']):.3f}x (per round "
                          f"{[round(x, 3) for x in rate['first_ratio']]})", "within noise", "-"))
    rows.append((f"the {rate['after']} steps after the watch ended, with/without the panel "
                 f"(total time)",
                 f"{statistics.median(rate['after_ratio']):.3f}x (per round "
                 f"{[round(x, 3) for x in rate['after_ratio']]}; building the explorer takes "
                 f"{1e3 * rate['explorer_s']:.0f} ms)", "within noise", "-"))
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, str(HERE))
    from bench_common import SIZES
    mode = "quick" if "--quick" in argv else "full"
    src = argv[argv.index("--src") + 1] if "--src" in argv else ""
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    r = time_live(SIZES[mode], mode, src, only)
    for row in live_lines(r):
        print(" | ".join(row))
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
