"""The observed steps as they are recorded, and as the `steps` table.

One record per observed step: a column -> per-tensor array dict (the columns of
`diagkit.core.schema.STEPS_COLUMNS`, plus `checksum` when ranks are compared). The table is
built once, at the end, by concatenating the arrays: no per-row work while training runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.schema import BOOL_STEP_COLUMNS, STEPS_COLUMNS


class StepRecords:
    """The records of the steps observed so far, for the tensors named `names`."""

    def __init__(self, names: list[str], checksums: bool):
        self.names, self.checksums = names, checksums
        self._records: list[dict[str, np.ndarray]] = []
        self._step_ids: list[int] = []
        self._rows: list[np.ndarray | None] = []  # the tensors a record holds (None: all)

    def __len__(self) -> int:
        return len(self._records)

    def add(self, step: int, record: dict[str, np.ndarray], rows: np.ndarray | None = None
            ) -> None:
        """`rows`: the tensors (indices) the step is recorded for, when not all of them (the
        others rested: their optimizers did not step, `measure.clock.step_clock`)."""
        if rows is not None:
            record = {c: v[rows] for c, v in record.items()}
        self._records.append(record)
        self._step_ids.append(step)
        self._rows.append(rows)

    def mark_changed(self, indices) -> set[int]:
        """Mark tensors (indices) changed on the last recorded step holding each, delta_norm
        NaN (not measured): the frozen base's change, found when observing ends and dated to
        the window (`measure.change.split_probe.FrozenWindow`). The record is replaced, never edited
        in place, so a `snapshot()` taken before keeps what it saw. Returns the indices
        marked (none with no recorded step)."""
        left, marked = set(int(k) for k in indices), set()
        for i in range(len(self._records) - 1, -1, -1):
            if not left:
                break
            rows = self._rows[i]
            at = (sorted(left) if rows is None
                  else [pos for pos, k in enumerate(rows.tolist()) if k in left])
            if not at:
                continue
            got = set(at) if rows is None else {int(rows[pos]) for pos in at}
            record = dict(self._records[i])
            for col, value in (("changed", True), ("delta_norm", np.nan)):
                record[col] = record[col].copy()
                record[col][at] = value
            self._records[i] = record
            left, marked = left - got, marked | got
        return marked

    def snapshot(self) -> "StepRecords":
        """The records so far, as later steps will not change them (a record is replaced,
        never changed in place, so copying the lists is enough): what the live view reads on
        its own thread while the loop goes on (`diagkit.run.live.view`)."""
        copy = StepRecords(self.names, self.checksums)
        copy._records, copy._step_ids = self._records[:], self._step_ids[:]
        copy._rows = self._rows[:]
        return copy

    def tail(self, start: int) -> list[tuple[int, np.ndarray | None, dict[str, np.ndarray]]]:
        """The records from the `start`-th on, each as (step, the tensors it holds (indices
        into `names`; None: all), its columns): what the live view reads of the steps it has
        not seen yet, without building the table again (`diagkit.run.live.trail`)."""
        return list(zip(self._step_ids[start:], self._rows[start:], self._records[start:]))

    def _names_of(self, i: int) -> np.ndarray:
        names = np.array(self.names, dtype=object)
        return names if self._rows[i] is None else names[self._rows[i]]

    def table(self) -> pd.DataFrame:
        """Every recorded step, one row per (step, tensor)."""
        n, count = len(self.names), len(self._records)
        if any(r is not None for r in self._rows):
            sizes = [n if r is None else len(r) for r in self._rows]
            data = {"step": np.repeat(np.array(self._step_ids, dtype=np.int64), sizes),
                    "name": np.concatenate([self._names_of(i) for i in range(count)])}
        else:
            data = {"step": np.repeat(np.array(self._step_ids, dtype=np.int64), n),
                    "name": np.tile(np.array(self.names, dtype=object), count)}
        columns = list(STEPS_COLUMNS) + (["checksum"] if self.checksums else [])
        for col in columns[2:]:
            data[col] = (np.concatenate([r[col] for r in self._records]) if count
                         else np.array([], dtype=bool if col in BOOL_STEP_COLUMNS else float))
        return pd.DataFrame(data, columns=columns)

    def one(self, step: int) -> dict[str, np.ndarray]:
        """The columns of one recorded step (the latest, if it was recorded twice): arrays, so
        that a rank publishing every observed step builds no DataFrame for it."""
        i = len(self._step_ids) - 1 - self._step_ids[::-1].index(step)
        record, names = self._records[i], self._names_of(i)
        return {"step": np.full(len(names), step, dtype=np.int64), "name": names, **record}
