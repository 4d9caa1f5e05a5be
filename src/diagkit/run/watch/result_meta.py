"""What a watch's result says of the watch itself, its `meta` (docs/result.md): the options it
ran with, the steps and `step()` calls counted, how it ended, the wrappers seen through, the
user's names, the lines that built the groups. Built at the end, and for each save of a
whole run and each update of the live view (which is handed the watch's own builder)."""

from __future__ import annotations

import time

import torch


def watch_meta(w, *, ended: str, started: float) -> dict:
    """`meta` of watch `w` as it stands now: `ended` says how it ended (steps, stop, exit,
    SIGTERM, failed), `started` is the `time.perf_counter()` it began at."""
    return {"loop": "watch", "steps_requested": w.steps, "delta": w.delta,
            "optimizers": len(w.optimizers),
            "every": w.every,
            "optimizer_steps": 0 if w.clock is None else w.clock.count,
            **_calls(w),
            "wrappers": w.wrappers, "losses": [], "restored": False,
            "ended": ended,
            "seconds": round(time.perf_counter() - started, 4),
            "torch": torch.__version__,
            **({"optimizer_sources": w.sources} if w.sources else {}),
            **({"names": w.names} if w.names else {}),
            **_over_budget(w)}


def _calls(w) -> dict:
    """Each optimizer's own `step()` calls, and the steps that took more than one of some
    optimizer's (`optimizer_steps` counts the watch's steps: docs/result.md)."""
    if w.clock is None or not w.optimizers:
        return {}
    return {"optimizer_calls": list(w.clock.calls),
            **({"long_steps": list(w.clock.long_steps)} if w.clock.long_steps else {})}


def _over_budget(w) -> dict:
    """The tensors `memory_budget` moved from a snapshot to the fingerprint (CUDA), by name,
    so the result says so (docs/cost.md)."""
    moved = getattr(getattr(w.observer, "probe", None), "over_budget", None) or []
    names = w.inventory.names if w.inventory is not None else []
    return {"over_budget": [names[k] for k in moved if k < len(names)]} if moved else {}
