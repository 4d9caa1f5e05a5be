"""Rank 0's side of a watch under a process group: one steps table from every rank's
published steps, each rank's state, one failure naming the ranks it did not hear from, and what
DDP reports."""

from __future__ import annotations

import pandas as pd

from ...core.result import StepFailure
from ...core.schema import STEPS_COLUMNS
from ..diagnose.gather import Gathered, RankChannel


def assemble(channel: RankChannel, timeout: float, own: StepFailure | None, rows: list[dict]
             ) -> tuple[pd.DataFrame, StepFailure | None, dict[int, dict], list[dict]]:
    """(steps with `rank` and `checksum`, the run's failure, each rank's state, every rank's
    inventory rows joined: `rows` are rank 0's own)."""
    got = channel.collect(timeout)
    rows = channel.rows(rows)
    channel.clear()
    steps = (pd.concat(got.tables, ignore_index=True).sort_values(
                 ["step", "rank"], kind="stable", ignore_index=True)
             if got.tables else pd.DataFrame(columns=["rank", *STEPS_COLUMNS, "checksum"]))
    ranks = {r: rank_state(s, got.published[r]) for r, s in got.statuses.items()}
    return steps, own or _failure(got, timeout), ranks, rows


def rank_state(status: dict | None, published: int) -> dict:
    """`meta["ranks"][r]`: `state` ("done": it finished observing; "running": alive, found not
    stepping, not waited for; "unfinished": not heard from), `observed_steps` (every step it
    published: a whole-run watch's rank 0 takes them as it goes, so the steps table left at the
    end does not count them), `optimizer_steps`, and for a rank that never began an optimizer
    step its `backward_passes` (`judge.rules_ranks.never_stepped`)."""
    if status is None:
        return {"state": "unfinished", "observed_steps": int(published)}
    state = {"state": "running" if status.get("running") else "done",
             "observed_steps": int(published), "optimizer_steps": status["optimizer_steps"]}
    if status.get("stepped") is False:
        state["backward_passes"] = int(status["backward_passes"])
    return state


def _failure(got: Gathered, timeout: float) -> StepFailure | None:
    """The first rank's own failure, else the ranks that never reported within `timeout`."""
    statuses, published = got.statuses, got.published
    failed = {r: s["failure"] for r, s in statuses.items() if s and s.get("failure")}
    if failed:
        r, f = min(failed.items())
        return StepFailure(f.step, f"rank {r}: {f.error}", f.traceback)
    silent = sorted(r for r, s in statuses.items() if s is None)
    if not silent:
        return None
    kept = ", ".join(f"rank {r}: {published.get(r, 0)}" for r in silent)
    # A silent rank whose last sign came before any optimizer step: what it had done by then.
    signs = "".join(f"; rank {r} had run {k} backward pass{'es' * (k != 1)} and not yet "
                    "called optimizer.step()"
                    for r, (k, stepped) in sorted(got.signs.items()) if not stepped)
    return StepFailure(min(published.get(r, 0) for r in silent),
                       f"rank {', '.join(map(str, silent))} did not finish within {timeout:g} s "
                       f"of rank 0 (died or hangs); the steps it observed are kept ({kept})"
                       f"{signs}", "")
