"""K. The live view (docs/workbook.md, "The live view"): the bench models' step time under a
watch that shows the live panel, against the same watch without it, in a real Jupyter kernel
(started here with jupyter_client; its widget messages go out over IOPub as they would to
JupyterLab). Interleaved as in F (`watch_time.timed_steps`): per round, a block of steps under
`watch(..., live=False)` and one under `watch(..., live=True)`, in alternating order; the first
and last step of each block (set-up, judging, the explorer) are left out of the ratio.

    python benchmarks/live_time.py [--quick]     # or as section K of overhead.py
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

KERNEL_CODE = """
import json, statistics, sys
sys.path.insert(0, {here!r})
import torch
torch.set_num_threads(1)
import diagkit
from overhead import build
from watch_time import timed_steps

out = {{}}
for kind, cfg, rounds, k in {plan!r}:
    model, opt, batch_fn, loss_fn = build(kind, cfg)

    def step(_i):
        opt.zero_grad()
        loss_fn(model, batch_fn()).backward()
        opt.step()

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
            medians[live] = statistics.median(times[1:-1])
        ratios.append(medians[True] / medians[False])
    med = statistics.median
    out[kind] = {{"rounds": rounds, "steps_per_block": k, "without_s": med(blocks[False]),
                 "with_s": med(blocks[True]), "ratio_of_medians": med(blocks[True]) /
                 med(blocks[False]), "median_of_round_ratios": med(ratios),
                 "round_ratios": ratios, "updates": updates, "feed_busy_s": busy}}
print("LIVE-RESULT " + json.dumps(out))
"""

PLANS = {"full": [("gpt", "gpt", 7, 8), ("small", "small", 9, 40)],
         "quick": [("gpt", "gpt", 2, 4), ("small", "small", 2, 10)]}


def time_live(sizes: dict, mode: str) -> dict:
    """Run the rounds in a fresh kernel; its result, by model."""
    from jupyter_client.manager import start_new_kernel
    plan = [(kind, sizes[key], rounds, k) for kind, key, rounds, k in PLANS[mode]]
    km, kc = start_new_kernel(kernel_name="python3")
    found, errors = [], []

    def output(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream" and "LIVE-RESULT " in content["text"]:
            found.append(content["text"].split("LIVE-RESULT ", 1)[1])
        elif msg["msg_type"] == "error":
            errors.append("\n".join(content["traceback"])[-3000:])

    try:
        kc.execute_interactive(textwrap.dedent(KERNEL_CODE.format(here=str(HERE), plan=plan)),
                               output_hook=output, timeout=3600)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    if errors or not found:
        raise RuntimeError(f"the kernel's run failed: {errors or 'no result printed'}")
    return json.loads(found[0])


def live_lines(r: dict) -> list[tuple]:
    """The table rows (measure, measured, goal, status): within noise is the goal."""
    rows = []
    for kind, x in r.items():
        rows.append((f"step time with/without the live view, {kind} (a real kernel)",
                     f"{x['ratio_of_medians']:.3f}x (without {1e3 * x['without_s']:.1f} ms, "
                     f"with {1e3 * x['with_s']:.1f} ms; per-round median "
                     f"{x['median_of_round_ratios']:.3f}x; {x['updates']} updates, feed "
                     f"{1e3 * x['feed_busy_s']:.0f} ms in all)", "within noise", "-"))
    return rows


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    from overhead import SIZES
    mode = "quick" if "--quick" in (argv or sys.argv[1:]) else "full"
    r = time_live(SIZES[mode], mode)
    for row in live_lines(r):
        print(" | ".join(row))
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
