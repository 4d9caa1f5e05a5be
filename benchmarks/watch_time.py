"""F. `diagkit.watch` in the user's own loop: per-step time watched vs plain, and after detaching.

Interleaved like A: per round one block of plain steps, one block under a fresh
`diagkit.watch(model, opt, steps=k + 2)` and one block of the same loop right after that watch
detached itself. The user's loop is the standard step (zero_grad, batch, loss, backward,
optimizer.step()), timed step by step; under watch the observer's work happens inside it (the
optimizers' step hooks), so each timed step holds all of it. A watched block's first step
(after the watch was set up) and last step (which judges the result, inside the last
optimizer's hook) are one-off costs, reported apart; "after" shows that a detached watch costs
nothing.
"""

from __future__ import annotations

import statistics
import time


def timed_steps(step, n: int) -> list[float]:
    """Seconds of each of `n` calls `step(i)`: the user's loop, timed step by step."""
    times = []
    for i in range(n):
        s = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - s)
    return times


def time_watch(build, kind: str, cfg: dict, rounds: int, k: int) -> dict:
    """Medians and ratios of plain, watched and after-detach steps of `build(kind, cfg)`."""
    import diagkit
    from diagkit.measure.model.restore import SavedState
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.target.target import Setup

    model, opt, batch_fn, loss_fn = build(kind, cfg)
    step = step_function(Setup(model=model, optimizer=opt, batch_fn=batch_fn, loss_fn=loss_fn))
    for i in range(2):  # warm-up: allocator, AdamW state, .grad buffers
        step(i)
    saved = SavedState(model, list(model.parameters()), [opt])

    def block(n: int) -> list[float]:
        return timed_steps(step, n)

    plain, watched, after, ratios, after_ratios = [], [], [], [], []
    first, last = [], []
    for r in range(rounds):
        blocks = {}
        for name in (["plain", "watch"] if r % 2 == 0 else ["watch", "plain"]):
            if name == "plain":
                blocks["plain"] = block(k + 1)[1:]
            else:
                w = diagkit.watch(model, opt, steps=k + 2)
                times = block(k + 2)
                assert w.done, "the watch should have detached after its last step"
                first.append(times[0])
                last.append(times[-1])
                blocks["watch"] = times[1:-1]
                blocks["after"] = block(k + 1)[1:]
            saved.restore()
        plain += blocks["plain"]
        watched += blocks["watch"]
        after += blocks["after"]
        ratios.append(statistics.median(blocks["watch"]) / statistics.median(blocks["plain"]))
        after_ratios.append(statistics.median(blocks["after"])
                            / statistics.median(blocks["plain"]))
    med = statistics.median
    return {"rounds": rounds, "steps_per_block": k,
            "plain_step_s": med(plain), "watched_step_s": med(watched),
            "after_step_s": med(after),
            "ratio_of_medians": med(watched) / med(plain),
            "median_of_round_ratios": med(ratios),
            "after_ratio_of_medians": med(after) / med(plain),
            "after_round_ratios": after_ratios, "round_ratios": ratios,
            "first_step_extra_s": med(first) - med(plain),
            "last_step_with_judging_s": med(last)}


def watch_lines(kind: str, r: dict, goal: float) -> list[tuple]:
    """The table rows of one model's watch figures (measure, measured, goal, status)."""
    met = "met" if r["ratio_of_medians"] <= goal else "NOT met"
    return [
        (f"step time watched/plain, {kind}, diagkit.watch in the user's loop",
         f"{r['ratio_of_medians']:.3f}x (plain {1e3 * r['plain_step_s']:.1f} ms, watched "
         f"{1e3 * r['watched_step_s']:.1f} ms; per-round median "
         f"{r['median_of_round_ratios']:.3f}x)", f"<= {goal:.2f}x", met),
        (f"  after the watch detached, {kind}",
         f"{r['after_ratio_of_medians']:.3f}x (no hook left)", "1.00x (noise only)", "-"),
        (f"  one-off, {kind} (not in the ratio)",
         f"first step +{1e3 * r['first_step_extra_s']:.0f} ms, last step with judging "
         f"{1e3 * r['last_step_with_judging_s']:.0f} ms", "-", "-"),
    ]
