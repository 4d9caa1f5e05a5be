"""L. The whole call: `diagkit.diagnose(..., steps=n)` against n plain steps, fixed cost included.

What a user pays for one diagnosis is not only the per-step ratio of A: it is the call, with
its inventory, the restore point taken and put back, the first step's set-up (snapshot buffers,
the graph walk) and the judging. Interleaved per round: a block of n plain steps, the call, and
a second block of n plain steps (the A/A control: what this machine's noise alone reads), in an
order that alternates between rounds. The fixed cost is read from the same rounds as
`diagnose(steps=1)` minus one plain step. Every call restores the model bitwise, so every block
starts from the same state.
"""

from __future__ import annotations

import statistics
import time


def _plain_block(step, n: int) -> float:
    """Seconds of n calls of `step`, the loop `diagnose` runs (`diagkit.run.diagnose.loop`)."""
    s = time.perf_counter()
    for i in range(n):
        step(i)
    return time.perf_counter() - s


def time_whole_call(build, kind: str, cfg: dict, rounds: int, n: int) -> dict:
    """Medians and ratios of `diagnose(steps=n)` against n plain steps of `build(kind, cfg)`."""
    import diagkit
    from diagkit.measure.model.restore import SavedState
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.target.target import Setup

    model, opt, batch_fn, loss_fn = build(kind, cfg)
    step = step_function(Setup(model=model, optimizer=opt, batch_fn=batch_fn, loss_fn=loss_fn))
    _plain_block(step, 2)  # AdamW state and .grad exist, as in a run
    saved = SavedState(model, list(model.parameters()), [opt])

    def call(steps: int) -> float:
        s = time.perf_counter()
        diagkit.diagnose(model, opt, batch_fn=batch_fn, loss_fn=loss_fn, steps=steps)
        return time.perf_counter() - s

    call(n)  # the first call in a process imports pandas and the judging code: not per call
    plain, plain_aa, whole, one, one_plain, ratios = [], [], [], [], [], []
    for r in range(rounds):
        order = ["plain", "call", "aa"] if r % 2 == 0 else ["aa", "call", "plain"]
        got = {}
        for what in order:
            got[what] = call(n) if what == "call" else _plain_block(step, n)
            saved.restore()
        one.append(call(1))
        one_plain.append(_plain_block(step, 1))
        saved.restore()
        plain.append(got["plain"])
        plain_aa.append(got["aa"])
        whole.append(got["call"])
        ratios.append(got["call"] / got["plain"])
    med = statistics.median
    return {"rounds": rounds, "steps": n, "plain_s": med(plain), "call_s": med(whole),
            "ratio_of_medians": med(whole) / med(plain), "median_of_round_ratios": med(ratios),
            "aa_ratio": med(plain_aa) / med(plain),
            "fixed_cost_s": med(one) - med(one_plain), "plain_step_s": med(one_plain),
            "round_ratios": ratios}


def whole_call_lines(kind: str, r: dict, goal: float) -> list[tuple]:
    """The table rows (measure, measured, goal, status) of one model's whole call."""
    met = "met" if r["ratio_of_medians"] <= goal else "NOT met"
    return [
        (f"whole call diagnose(steps={r['steps']}) / {r['steps']} plain steps, {kind}",
         f"{r['ratio_of_medians']:.3f}x ({r['plain_s']:.2f} -> {r['call_s']:.2f} s; per-round "
         f"median {r['median_of_round_ratios']:.3f}x; A/A control {r['aa_ratio']:.3f}x)",
         f"<= {goal:.2f}x", met),
        (f"  fixed cost per call, {kind} (diagnose(steps=1) - one plain step)",
         f"{1e3 * r['fixed_cost_s']:.0f} ms (plain step {1e3 * r['plain_step_s']:.0f} ms)",
         "-", "-"),
    ]
