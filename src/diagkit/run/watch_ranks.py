"""Rank 0's side of a watch under a process group: one steps table from every rank's
published steps, one failure naming the ranks it did not hear from, and what DDP reports."""

from __future__ import annotations

import pandas as pd

from ..core.result import StepFailure
from ..core.schema import STEPS_COLUMNS
from .gather import RankChannel


def assemble(channel: RankChannel, timeout: float, own: StepFailure | None, rows: list[dict]
             ) -> tuple[pd.DataFrame, StepFailure | None, dict[int, dict], list[dict]]:
    """(steps with `rank` and `checksum`, the run's failure, each rank's state, every rank's
    inventory rows joined: `rows` are rank 0's own)."""
    tables, statuses, published = channel.collect(timeout)
    rows = channel.rows(rows)
    channel.clear()
    steps = (pd.concat(tables, ignore_index=True).sort_values(["step", "rank"], kind="stable",
                                                            ignore_index=True)
             if tables else pd.DataFrame(columns=["rank", *STEPS_COLUMNS, "checksum"]))
    # Every step each rank published: a whole-run watch's rank 0 takes (and frees) the other
    # ranks' steps window by window, so the tables left at the end do not count them.
    ranks = {r: {"state": "done" if s is not None else "unfinished",
                 "observed_steps": int(published[r]),
                 **({"optimizer_steps": s["optimizer_steps"]} if s else {})}
             for r, s in statuses.items()}
    return steps, own or _failure(statuses, published, timeout), ranks, rows


def _failure(statuses: dict[int, dict | None], published: dict, timeout: float
             ) -> StepFailure | None:
    """The first rank's own failure, else the ranks that never reported within `timeout`."""
    failed = {r: s["failure"] for r, s in statuses.items() if s and s.get("failure")}
    if failed:
        r, f = min(failed.items())
        return StepFailure(f.step, f"rank {r}: {f.error}", f.traceback)
    silent = sorted(r for r, s in statuses.items() if s is None)
    if not silent:
        return None
    kept = ", ".join(f"rank {r}: {published.get(r, 0)}" for r in silent)
    return StepFailure(min(published.get(r, 0) for r in silent),
                       f"rank {', '.join(map(str, silent))} did not finish within {timeout:g} s "
                       f"of rank 0 (died or hangs); the steps it observed are kept ({kept})", "")
