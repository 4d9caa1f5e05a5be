"""Which observed steps a whole-run watch keeps in `diagnosis.steps`, so that its memory does
not grow with the run's length (docs/whole-run.md, "The whole run"; `meta["kept_steps"]` says
what was kept).

Kept, at most `AROUND + SAMPLE + latest` observed steps in all:
- every step of the windows judged right after a wiring change (and at the start), up to
  `AROUND` windows: the first half of them and the most recent ones;
- a uniform sample (reservoir sampling, seeded: the same run keeps the same steps) of
  `SAMPLE` of the other observed steps;
- the latest window, whatever it was.

The verdicts are not judged from what is kept: each window is judged whole as it closes
(`diagkit.run.watch.whole_run`), so dropping steps here loses rows, never a finding.
"""

from __future__ import annotations

import random

import pandas as pd

from ..tables.step_records import StepRecords

AROUND = 16   # windows around changes kept whole
SAMPLE = 32   # other observed steps kept, sampled uniformly


class KeptSteps:
    """The kept steps tables, added one judged window at a time."""

    def __init__(self, around: int = AROUND, sample: int = SAMPLE, seed: int = 0):
        self.around_limit, self.sample_limit = around, sample
        self.around: list[pd.DataFrame] = []
        self.sample: list[pd.DataFrame] = []
        self.latest: pd.DataFrame | None = None
        self.seen = 0          # observed steps offered to the sample
        self.observed = 0      # observed steps added in all
        self._rng = random.Random(seed)

    def add(self, table: pd.DataFrame, *, around_change: bool) -> None:
        """A judged window's steps; `around_change`: it opened just after a change."""
        self.observed += int(table["step"].nunique()) if len(table) else 0
        previous, self.latest = self.latest, table
        if previous is not None and not any(previous is t for t in self.around):
            self._offer(previous)
        if around_change:
            self.around.append(table)
            if len(self.around) > self.around_limit:
                del self.around[self.around_limit // 2]  # keep the first ones and the latest

    def _offer(self, table: pd.DataFrame) -> None:
        """Each step of `table` to the reservoir."""
        for _, one in table.groupby("step", sort=True):
            self.seen += 1
            if len(self.sample) < self.sample_limit:
                self.sample.append(one)
                continue
            j = self._rng.randrange(self.seen)
            if j < self.sample_limit:
                self.sample[j] = one

    def rename(self, names: dict[str, str]) -> None:
        """Rename tensors in every kept table, in place (each table stays the object it was):
        a whole run's tensor replaced mid-run is named apart from its successor
        (`diagkit.run.watch.whole_run`)."""
        tables = {id(t): t for t in [*self.around, *self.sample, self.latest]
                  if t is not None}
        for table in tables.values():
            if len(table) and table["name"].isin(names.keys()).any():
                table["name"] = table["name"].map(lambda n: names.get(n, n))

    def table(self) -> pd.DataFrame:
        """Every kept row, by step."""
        parts = [*self.around, *self.sample]
        if self.latest is not None and not any(p is self.latest for p in parts):
            parts.append(self.latest)
        parts = [p for p in parts if len(p)]
        if not parts:  # none kept (the first observed step failed): the columns, to judge
            return StepRecords([], checksums=False).table()
        return (pd.concat(parts, ignore_index=True)
                .sort_values(["step"] + (["rank"] if "rank" in parts[0] else []),
                             kind="stable", ignore_index=True))

    def describe(self) -> dict:
        """What was kept, for `meta["kept_steps"]`."""
        kept = self.table()
        return {"observed": self.observed,
                "kept": int(kept["step"].nunique()) if len(kept) else 0,
                "rule": f"every step of up to {self.around_limit} windows around wiring "
                        f"changes, a uniform sample of {self.sample_limit} other observed "
                        f"steps, and the latest window"}
