"""Issue 35, item 4, for `cuda_check.py`: a compiled small GPT-like decoder under watch. Dynamo's
counters (graph breaks, new graphs, traced frames) over each phase, with what dynamo traced and
why it compiled again; the per-step time, plain against watched, and a whole-run watch's observed
and unobserved steps.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

import diagkit
from cuda_checks_issue35 import failure, llama, lm_step, observed_steps, sync, tokens


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters
    return {"graph_break": sum(counters["graph_break"].values()),
            "unimplemented": sum(counters["unimplemented"].values()),
            "frames": counters["frames"]["total"],
            "unique_graphs": counters["stats"]["unique_graphs"]}


class DynamoLog(logging.Handler):
    """What dynamo traced and why it compiled again: its own log lines ("start tracing",
    "Recompiling ... guard failure(s)"), kept while `torch._logging` has them on."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        msg = record.getMessage()
        if "start tracing" in msg or "Recompiling" in msg or "graph break" in msg.lower():
            self.lines.append(" | ".join(x.strip() for x in msg.splitlines())[:400])

    @staticmethod
    def _quiet(record):  # torch's own handlers print only what they would print anyway
        return record.levelno >= logging.WARNING

    def __enter__(self):
        torch._logging.set_logs(dynamo=logging.INFO, recompiles=True, graph_breaks=True)
        self._theirs = [h for name in list(logging.root.manager.loggerDict)
                        if name == "torch" or name.startswith("torch.")
                        for h in logging.getLogger(name).handlers]
        for h in self._theirs:
            h.addFilter(self._quiet)
        logging.getLogger("torch._dynamo").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("torch._dynamo").removeHandler(self)
        for h in self._theirs:
            h.removeFilter(self._quiet)
        torch._logging.set_logs()

    def since(self, n):
        return self.lines[n:]


def timed(ctx, step, n) -> list[float]:
    out = []
    for _ in range(n):
        sync(ctx)
        t = time.perf_counter()
        step()
        sync(ctx)
        out.append(time.perf_counter() - t)
    return out


def compile_figures(ctx):
    """A compiled small GPT-like decoder (Llama from its config, float32 parameters under
    autocast in ctx's dtype, every tensor trains): dynamo's counters over each phase (watch
    with steps=n attached and detached between plain blocks, a whole-run watch, plain steps
    after it), and the per-step time, plain A against watched B, interleaved A B A with an
    A/A control."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    size = (dict(vocab=512, hidden=64, inter=128, layers=2, heads=4) if ctx.quick else
            dict(vocab=8192, hidden=512, inter=1376, layers=2, heads=8))
    model = llama(ctx, **size).float()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = tokens(ctx, size["vocab"], *((2, 32) if ctx.quick else (8, 256)))
    cm = torch.compile(model, backend=ctx.backend)
    amp = torch.float32 != ctx.dtype

    def step():
        with torch.autocast(ctx.device, dtype=ctx.dtype, enabled=amp):
            lm_step(cm, opt, x)
    n, rounds = (3, 2) if ctx.quick else (10, 4)
    phases, a, b, a2 = {}, [], [], []
    with DynamoLog() as dlog:
        t = time.perf_counter()
        timed(ctx, step, 3)  # compiles
        compile_s = time.perf_counter() - t
        timed(ctx, step, 3)  # settles
        plain, mark, at = dynamo_counts(), dynamo_counts(), len(dlog.lines)

        def phase(name):
            nonlocal mark, at
            now = dynamo_counts()
            phases[name] = {"added": {k: now[k] - mark[k] for k in now},
                            "log": dlog.since(at)}
            mark, at = now, len(dlog.lines)
        for _ in range(rounds):
            a += timed(ctx, step, n)
            w = diagkit.watch(cm, opt, steps=n)
            b += timed(ctx, step, n)
            w.stop()
            a2 += timed(ctx, step, n)
        phase("watch(steps=n), attach/observe/detach between plain blocks")
        w = diagkit.watch(cm, opt, steps=None, every=2)
        whole = timed(ctx, step, 2 * n)
        diag = w.stop()
        phase("whole-run watch (every=2), observed and unobserved steps")
        a2 += timed(ctx, step, 2)
        phase("plain steps after the whole-run watch detached")
    added = {k: sum(p["added"][k] for p in phases.values()) for k in plain}
    ctx.check("4 torch.compile: 0 graph breaks, 0 new graphs, 0 traced frames under watch",
              not any(added.values()), "; ".join(
                  f"{k}: {v['added']}" + (f" log {v['log'][:3]}" if v["log"] else "")
                  for k, v in phases.items()) + f"; plain compile had {plain}{failure(diag)}")
    med = statistics.median
    seen = observed_steps(diag, len(whole))
    obs = [t for t, o in zip(whole, seen) if o]
    unobs = [t for t, o in zip(whole, seen) if not o]
    figures = {"backend": ctx.backend, "autocast": str(ctx.dtype) if amp else None,
               "compile_s": compile_s, "dynamo_plain": plain, "dynamo_by_phase": phases,
               "plain_ms": 1e3 * med(a + a2), "watched_ms": 1e3 * med(b),
               "ratio": med(b) / med(a + a2), "aa_control": med(a2) / med(a),
               "whole_run_observed": seen,
               "whole_run_observed_ms": 1e3 * med(obs) if obs else None,
               "whole_run_unobserved_ms": 1e3 * med(unobs) if unobs else None,
               "steps_per_block": n, "rounds": rounds, "size": size}
    ms = lambda v: "n/a" if v is None else f"{v:.2f} ms"  # noqa: E731
    ctx.info(f"compiled GPT-like ({ctx.backend}, compiled in {compile_s:.1f} s): plain "
             f"{figures['plain_ms']:.2f} ms, watched {figures['watched_ms']:.2f} ms, ratio "
             f"{figures['ratio']:.3f}x (A/A control {figures['aa_control']:.3f}x); whole run "
             f"every=2: observed {ms(figures['whole_run_observed_ms'])} ({len(obs)}), "
             f"unobserved {ms(figures['whole_run_unobserved_ms'])} ({len(unobs)}) vs plain")
    ctx.figure("compiled_gpt", figures)
