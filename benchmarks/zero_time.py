"""J. DeepSpeed ZeRO-3: `diagkit.watch(engine)` on the GPT under a ZeRO-3 engine (world 1, gloo,
DeepSpeed's CPU accelerator), per-step time watched vs the same engine's plain step, interleaved
as in F (`watch_time.timed_steps`): per round a block of plain `engine.backward(loss);
engine.step()` steps and a block under a fresh watch of `k + 2` steps (its first and last step,
set-up and judging, reported apart).

Watched through ZeRO's own groups (`diagkit.measure.engines.zero`): every tensor hooked (a process
group), each value measured on its partition and the partitions combined in one all-reduce per
observed step. An engine's state cannot be put back, so the rounds run on from each other.
"""

from __future__ import annotations

import os
import statistics
import warnings


def time_zero(build, kind: str, cfg: dict, rounds: int, k: int) -> dict:
    """Medians and ratios of plain and watched steps of `build(kind, cfg)`'s model under a
    ZeRO-3 engine in a gloo process group of one (started here, in memory, and ended after)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_RANK", "0")  # what a launcher sets: DeepSpeed insists
    import deepspeed
    import torch.distributed as dist

    import diagkit
    from watch_time import timed_steps

    # DeepSpeed's ZeRO-3 calls torch collectives torch deprecates, once a step each: hundreds of
    # FutureWarnings over the section that say nothing about diagkit or the figures.
    warnings.filterwarnings("ignore", r"`torch\.distributed\.\w+` is deprecated", FutureWarning)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, opt, batch_fn, loss_fn = build(kind, cfg)
        config = {"train_micro_batch_size_per_gpu": cfg["batch"],
                  "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 3}}
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

        def step(_i):
            engine.backward(loss_fn(engine, batch_fn()))
            engine.step()

        timed_steps(step, 2)  # warm-up: allocator, AdamW state
        plain, watched, ratios, first, last = [], [], [], [], []
        for r in range(rounds):
            blocks = {}
            for name in (["plain", "watch"] if r % 2 == 0 else ["watch", "plain"]):
                if name == "plain":
                    blocks["plain"] = timed_steps(step, k + 1)[1:]
                    continue
                w = diagkit.watch(engine, steps=k + 2)
                times = timed_steps(step, k + 2)
                assert w.done, "the watch should have detached after its last step"
                first.append(times[0])
                last.append(times[-1])
                blocks["watch"] = times[1:-1]
            plain += blocks["plain"]
            watched += blocks["watch"]
            ratios.append(statistics.median(blocks["watch"]) / statistics.median(blocks["plain"]))
    finally:
        dist.destroy_process_group()
    med = statistics.median
    return {"rounds": rounds, "steps_per_block": k, "stage": 3, "world": 1,
            "plain_step_s": med(plain), "watched_step_s": med(watched),
            "ratio_of_medians": med(watched) / med(plain), "median_of_round_ratios": med(ratios),
            "round_ratios": ratios, "first_step_extra_s": med(first) - med(plain),
            "last_step_with_judging_s": med(last)}


def zero_lines(kind: str, r: dict, goal: float) -> list[tuple]:
    """The table rows of the ZeRO-3 figures (measure, measured, goal, status)."""
    met = "met" if r["ratio_of_medians"] <= goal else "NOT met"
    return [
        (f"step time watched/plain, {kind} under DeepSpeed ZeRO-3 (world 1, gloo)",
         f"{r['ratio_of_medians']:.3f}x (plain {1e3 * r['plain_step_s']:.1f} ms, watched "
         f"{1e3 * r['watched_step_s']:.1f} ms; per-round median "
         f"{r['median_of_round_ratios']:.3f}x)", f"<= {goal:.2f}x", met),
        (f"  one-off, {kind} under ZeRO-3 (not in the ratio)",
         f"first step +{1e3 * r['first_step_extra_s']:.0f} ms, last step with judging "
         f"{1e3 * r['last_step_with_judging_s']:.0f} ms", "-", "-"),
    ]
