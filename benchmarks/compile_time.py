"""P. A compiled GPT (issue 35, item 4): `torch.compile` (inductor) of the bench's GPT, plain
steps against steps under `diagkit.watch`, and dynamo's counters over the whole section.

- Time: per round a plain block, a watched block (`watch(steps=k + 2)`: its first and last
  steps, set-up and judging, are reported apart, as in F and O) and a second plain block (the
  A/A control), the order alternating between rounds; the model is compiled once, before
  the first round, so no block pays the compile. Also a whole-run watch (`steps=None,
  every=2`): its observed and unobserved steps against plain ones.
- Graph: dynamo's `graph_break`, `frames` and `stats.unique_graphs` counters after the
  warm-up and at the end; observing must leave them as they were (docs/watch.md,
  "torch.compile").
"""

from __future__ import annotations

import statistics
import time


def _step(model, opt, batch_fn, loss_fn):
    loss = loss_fn(model, batch_fn())
    opt.zero_grad()
    loss.backward()
    opt.step()


def _counts() -> dict:
    from torch._dynamo.utils import counters
    return {"graph_break": sum(counters["graph_break"].values()),
            "frames": counters["frames"]["total"],
            "unique_graphs": counters["stats"]["unique_graphs"]}


def time_compiled(build, cfg: dict, rounds: int = 5, k: int = 3) -> dict:
    """`build(kind, cfg)` is bench_common's (model, optimizer, batch_fn, loss_fn)."""
    import torch
    import diagkit
    from diagkit.measure.model.restore import SavedState
    model, opt, batch_fn, loss_fn = build("gpt", cfg)
    compiled = torch.compile(model)
    started = time.perf_counter()
    for _ in range(3):
        _step(compiled, opt, batch_fn, loss_fn)
    compile_s = time.perf_counter() - started
    before = _counts()
    saved = SavedState(model, list(model.parameters()), [opt])

    def block(n: int) -> list[float]:
        times = []
        for _ in range(n):
            s = time.perf_counter()
            _step(compiled, opt, batch_fn, loss_fn)
            times.append(time.perf_counter() - s)
        return times

    got = {"plain": [], "watch": [], "aa": [], "edges": []}
    for r in range(rounds):
        for name in (["plain", "watch", "aa"] if r % 2 == 0 else ["aa", "watch", "plain"]):
            if name == "watch":
                w = diagkit.watch(compiled, opt, steps=k + 2)
                times = block(k + 2)
                assert w.done
                got["watch"] += times[1:-1]
                got["edges"] += [times[0], times[-1]]
            else:
                got[name] += block(k)
            saved.restore()
    whole = _whole_run(compiled, opt, batch_fn, loss_fn, block, k)
    med = statistics.median
    plain = med(got["plain"])
    return {"rounds": rounds, "steps_per_block": k, "compile_s": compile_s,
            "plain_step_s": plain, "watched_step_s": med(got["watch"]),
            "ratio": med(got["watch"]) / plain, "aa_ratio": med(got["aa"]) / plain,
            "edge_step_s": med(got["edges"]), **whole,
            "dynamo_before": before, "dynamo_after": _counts()}


def _whole_run(compiled, opt, batch_fn, loss_fn, block, k: int) -> dict:
    """A whole-run watch, every=2: observed and unobserved steps against a plain block."""
    import diagkit
    plain = block(2 * k)
    w = diagkit.watch(compiled, opt, steps=None, every=2)
    times = block(4 * k + 4)[4:]  # past the first observed steps' burst
    w.stop()
    observed = w.diagnosis.steps["step"].unique().tolist()
    obs = [t for i, t in enumerate(times, start=4) if i in observed]
    unobs = [t for i, t in enumerate(times, start=4) if i not in observed]
    med = statistics.median
    return {"whole_observed_ratio": med(obs) / med(plain) if obs else float("nan"),
            "whole_unobserved_ratio": med(unobs) / med(plain) if unobs else float("nan")}


def compile_lines(r: dict, goal: float) -> list[tuple]:
    """The table rows (measure, measured, goal, status) of section P."""
    same = r["dynamo_before"] == r["dynamo_after"] and r["dynamo_after"]["graph_break"] == 0
    ratio = r["ratio"]
    return [
        ("step time watched/plain, compiled GPT (inductor)",
         f"{ratio:.3f}x (plain {r['plain_step_s'] * 1e3:.0f} ms, watched "
         f"{r['watched_step_s'] * 1e3:.0f} ms; A/A control {r['aa_ratio']:.3f}x; compiled in "
         f"{r['compile_s']:.0f} s)", f"<= {goal:.2f}x", "met" if ratio <= goal else "NOT met"),
        ("  whole run every=2, compiled GPT: observed; unobserved / plain",
         f"{r['whole_observed_ratio']:.3f}x; {r['whole_unobserved_ratio']:.3f}x", "-", "-"),
        ("  dynamo counters after observing (breaks, frames, graphs)",
         f"{r['dynamo_after']} (before: {r['dynamo_before']})", "unchanged",
         "met" if same else "NOT met"),
    ]
