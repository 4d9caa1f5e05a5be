"""Rank 0's side of a whole-run watch under a process group (docs/whole-run.md, "The whole
run"): each window of rank 0's observed steps is joined with the same steps of every other
rank (through the store, as `diagkit.run.diagnose.gather` publishes them), so the distributed verdicts
(`rank_divergent`, `rank_dependent_use`) are judged window by window; and the ranks' wiring is
compared at every observed step: a rank wired differently is one finding, from the first step
it was seen.
"""

from __future__ import annotations

import time

import pandas as pd

from ...core.result import Finding
from ..diagnose.gather import RankChannel

WAIT = 2.0  # seconds rank 0 waits at a window's end for a rank a step or two behind

CODE = "ranks_wired_differently"


class RankJoin:
    """Joins rank 0's windows with the other ranks'; `mismatch`: the first wiring difference."""

    def __init__(self, channel: RankChannel):
        self.channel = channel
        self.history: list[tuple[int, int]] = []  # rank 0's (step, wiring digest), recent
        self.seen = [-1] * channel.world          # the last step taken of each rank
        self.latest = -1                          # rank 0's last observed step
        self.mismatch: Finding | None = None
        # The ranks hold different tensors (pipeline stages): their wiring differs by design,
        # and is not compared (set from the joined rows at each window).
        self.staged = False

    def recorded(self, step: int, digest: int) -> None:
        """Rank 0 observed `step` wired as `digest`."""
        self.latest = step
        if not self.history or self.history[-1][1] != digest:
            self.history = self.history[-63:] + [(step, digest)]

    def join(self, steps: pd.DataFrame) -> pd.DataFrame:
        """Rank 0's window `steps` with every rank's rows of those steps (a `rank` column)."""
        own = steps.copy()
        own.insert(0, "rank", self.channel.rank)
        wanted, parts, last = set(own["step"]), [own], int(own["step"].max())
        deadline = time.monotonic() + WAIT
        for rank in range(self.channel.world):
            if rank == self.channel.rank:
                continue
            # Until it has published past this window, or WAIT is spent; not for a rank that
            # said it is done (taken once more: all it observed came before that) or that
            # never steps (`gather.RankChannel.never_steps`).
            while True:
                parts += self._take(rank, wanted)
                if self.seen[rank] >= last:
                    break
                if self.channel.done(rank):
                    parts += self._take(rank, wanted)
                    break
                if (time.monotonic() > deadline
                        or self.channel.never_steps(rank) is not None):
                    break
                time.sleep(0.002)
        return pd.concat(parts, ignore_index=True).sort_values(
            ["step", "rank"], kind="stable", ignore_index=True)

    def _take(self, rank: int, wanted: set) -> list[pd.DataFrame]:
        """Rank `rank`'s steps published since the last take, their wiring compared; those of
        `wanted` steps."""
        parts = []
        for table in self.channel.take_steps(rank):
            step = int(table["step"].iloc[0]) if len(table) else -1
            self.seen[rank] = max(self.seen[rank], step)
            self._compare(rank, step, table.attrs.get("wiring"))
            if step in wanted:
                parts.append(table)
        return parts

    def _compare(self, rank: int, step: int, digest) -> None:
        # A rank ahead of rank 0 (no sync) is compared only up to where rank 0 has been.
        mine = (next((d for s, d in reversed(self.history) if s <= step), None)
                if step <= self.latest else None)
        if (self.staged or self.mismatch is not None or mine is None or digest is None
                or digest == mine):
            return
        self.mismatch = Finding(
            CODE, "error", (),
            f"rank {rank}'s wiring differs from rank 0's at step {step} (which tensors require "
            f"grad, what the optimizer groups hold, or a group's lr reaching 0): from there the "
            f"ranks do not train the same model.",
            "Make every rank change its wiring at the same step: an unfreeze, add_param_group "
            "or lr change guarded by the rank (if rank == 0: ...) runs on that rank alone.",
            since=step, until=step)
