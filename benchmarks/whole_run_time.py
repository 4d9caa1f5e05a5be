"""I. The whole-run watch (`diagkit.watch(..., steps=None, every=100)`), docs/whole-run.md,
"The whole run".

- **Whole-run overhead**: interleaved rounds of one block of `n` plain steps and one block of
  the same `n` steps under a fresh whole-run watch (its start burst of 4 observed steps, one
  step in `every` after it, the windows judged as they close, `stop()` not included). The
  ratio is of the blocks' total times: every cost the run pays, the burst included, which a
  real run of 100,000 steps spreads thinner than this block does.
- **Unobserved steps**: the median of the watched block's steps that were not observed,
  against the plain steps' median (only the step counter and the wiring check run on them).
- **The change check**: `Wiring.changes` alone (what every step pays), on models of 500 and
  5,000 tensors, against a plain SGD step of the same model. Issue 25's goal: at most 0.2 % of
  the plain step on 5,000 tensors (`CHECK_GOAL`).
- **Memory over a long run**: a tiny model watched for `long_steps` steps at `every=100`: peak
  RSS after a tenth of the run and at its end, and the steps kept (`meta["kept_steps"]`).
"""

from __future__ import annotations

import resource
import statistics
import time

import torch
from torch import nn

BURST_FREE = 10  # steps after the start burst and its window before "unobserved" counts
CHECK_GOAL, CHECK_GOAL_TENSORS = 0.002, 5000  # issue 25: the check <= 0.2 % of a plain step


def time_whole_run(build, kind: str, cfg: dict, rounds: int, n: int, every: int) -> dict:
    import diagkit
    from diagkit.measure.model.restore import SavedState
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.target.target import Setup
    from watch_time import timed_steps

    model, opt, batch_fn, loss_fn = build(kind, cfg)
    step = step_function(Setup(model=model, optimizer=opt, batch_fn=batch_fn, loss_fn=loss_fn))
    for i in range(2):
        step(i)
    saved = SavedState(model, list(model.parameters()), [opt])
    clock = time.perf_counter

    def block() -> list[float]:
        return timed_steps(step, n)

    ratios, plain_all, unobserved_all, stops = [], [], [], []
    for r in range(rounds):
        got = {}
        for name in (["plain", "watch"] if r % 2 == 0 else ["watch", "plain"]):
            if name == "plain":
                got["plain"] = block()
            else:
                w = diagkit.watch(model, opt, steps=None, every=every)
                got["watch"] = block()
                s = clock()
                w.stop()
                stops.append(clock() - s)
            saved.restore()
        ratios.append(sum(got["watch"]) / sum(got["plain"]))
        plain_all += got["plain"]
        unobserved_all += [t for i, t in enumerate(got["watch"])
                           if i > BURST_FREE and i % every not in (0, 1)]
    med = statistics.median
    return {"rounds": rounds, "steps_per_block": n, "every": every,
            "whole_run_ratio": med(ratios), "round_ratios": ratios,
            "plain_step_s": med(plain_all), "unobserved_step_s": med(unobserved_all),
            "unobserved_ratio": med(unobserved_all) / med(plain_all),
            "stop_s": med(stops)}


class Many(nn.Module):
    """`tensors` small tensors (Linear(4, 4) weight and bias pairs) in a chain."""

    def __init__(self, tensors: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(tensors // 2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def time_change_check(tensors: int, repeats: int = 600) -> dict:
    """`Wiring.changes` on a model of `tensors` tensors vs one plain SGD step of it: medians of
    `repeats` checks and of one plain step per 10 checks, interleaved (600: a median that a
    busy host moves by a few per cent, not tens)."""
    from diagkit.measure.clock.wiring import Wiring

    torch.manual_seed(0)
    model = Many(tensors)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 4)

    def plain():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    for _ in range(3):
        plain()
    wiring = Wiring(model, [opt])
    try:
        checks, steps = [], []
        for i in range(repeats):
            s = time.perf_counter()
            wiring.changes(i)
            checks.append(time.perf_counter() - s)
            if i % 10 == 0:
                s = time.perf_counter()
                plain()
                steps.append(time.perf_counter() - s)
    finally:
        wiring.release()
    check, step = statistics.median(checks), statistics.median(steps)
    return {"tensors": tensors, "check_s": check, "plain_step_s": step,
            "fraction_of_step": check / step}


def long_run_memory(steps: int, every: int = 100) -> dict:
    """Peak RSS of a tiny model watched over `steps` steps, after a tenth and at the end.

    A fresh random batch and target every step, as a real run has: driven to zero output
    (one batch, or `pow(2)` of the output alone) this model converges until SGD's updates
    round away in float32, a stall the watch reports (and the run then times the alerts)."""
    import diagkit

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))  # no unit can die
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = diagkit.watch(model, opt, steps=None, every=every)
    marks, started = {}, time.perf_counter()
    for i in range(steps):
        opt.zero_grad()
        (model(torch.randn(2, 4)) - torch.randn(2, 2)).pow(2).mean().backward()
        opt.step()
        if i + 1 in (steps // 10, steps):
            marks[i + 1] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    seconds = time.perf_counter() - started
    diag = w.stop()
    return {"steps": steps, "every": every, "seconds": seconds,
            "peak_rss_kib": marks, "kept": diag.meta["kept_steps"],
            "growth_kib": marks[steps] - marks[steps // 10]}


def whole_run_lines(r: dict, goal: float) -> list[tuple]:
    rows = []
    for kind, t in r["time"].items():
        rows += [
            (f"whole-run watch (steps=None, every={t['every']}), {kind}: block of "
             f"{t['steps_per_block']} steps",
             f"{t['whole_run_ratio']:.3f}x (start burst included; per round "
             f"{', '.join(f'{x:.3f}' for x in t['round_ratios'])})",
             f"<= {goal:.2f}x", "met" if t["whole_run_ratio"] <= goal else "NOT met"),
            (f"  unobserved steps, {kind}",
             f"{t['unobserved_ratio']:.3f}x (plain {1e3 * t['plain_step_s']:.2f} ms)",
             "1.00x (noise only)", "-"),
            (f"  stop() (judging, not in the ratio), {kind}", f"{1e3 * t['stop_s']:.0f} ms",
             "-", "-")]
    for c in r["check"]:
        check_goal, status = "far below a step", "-"
        if c["tensors"] == CHECK_GOAL_TENSORS:
            check_goal = f"<= {100 * CHECK_GOAL:.1f} % of a plain step"
            status = "met" if c["fraction_of_step"] <= CHECK_GOAL else "NOT met"
        rows.append((f"  change check per step, {c['tensors']} tensors",
                     f"{1e6 * c['check_s']:.0f} us = {100 * c['fraction_of_step']:.2f} % of a "
                     f"plain step ({1e3 * c['plain_step_s']:.1f} ms)", check_goal, status))
    m = r["memory"]
    rows.append((f"  peak RSS over {m['steps']:,} steps (every={m['every']})",
                 f"+{m['growth_kib'] / 1024:.1f} MiB from step {m['steps'] // 10:,} to the end "
                 f"({m['kept']['kept']} of {m['kept']['observed']:,} observed steps kept, "
                 f"{m['seconds']:.0f} s)", "bounded (not growing)", "-"))
    return rows
