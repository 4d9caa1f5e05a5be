"""The grad norms the live view plots (docs/workbook.md, "The live view"), read from each
observed step's record once, as it comes: an update reads only the steps recorded since the
last one, so its cost does not grow with the steps observed.

Kept: the latest `KEEP_STEPS` observed steps, each as references to its record's arrays (no
copy), and the whole model's norm of each. A whole-run watch records each window in a fresh
observer: a new record list starts the reading from its first record again.
"""

from __future__ import annotations

import collections

import numpy as np

KEEP_STEPS = 200    # observed steps kept for the plot


class Trail:
    """`take(records)` after each snapshot; `lines(names)` for the plot."""

    def __init__(self, keep: int = KEEP_STEPS):
        # (step, the record's tensor names (a list shared by its records), the indices it
        # holds (None: all), grad norms, used)
        self.steps: collections.deque = collections.deque(maxlen=keep)
        self._source = None     # the record list read last (its `names` list, by identity)
        self._read = 0          # how many of its records were read
        self._index: dict[int, tuple[list, dict[str, int]]] = {}  # names list -> positions

    def take(self, records, source) -> int:
        """Read the records of `records` not read yet; `source`: the recording object they
        are a snapshot of (a new one: a new window, read from its start). How many were new."""
        if source is not self._source:
            self._source, self._read = source, 0
        new = records.tail(self._read)
        self._read += len(new)
        for step, rows, record in new:
            self.steps.append((int(step), records.names, rows,
                               np.asarray(record["grad_norm"], dtype=float),
                               np.asarray(record["used"], dtype=bool)))
        return len(new)

    def release(self) -> None:
        """Forget everything (the watch ended: nothing of its records is held here)."""
        self._source, self._read = None, 0
        self.steps.clear()
        self._index.clear()

    def _position(self, names: list, rows, name: str) -> int | None:
        """Where `name` is in a record over `names` holding `rows` (None: not there)."""
        held = self._index.get(id(names))
        if held is None or held[0] is not names:  # a new window's names (a few per run)
            if len(self._index) > 8:
                self._index.clear()
            held = self._index[id(names)] = (names, {n: k for k, n in enumerate(names)})
        k = held[1].get(name)
        if k is None or rows is None:
            return k
        found = np.flatnonzero(rows == k)
        return int(found[0]) if len(found) else None

    def lines(self, names) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(name, steps, grad norms) for each of `names` over the kept steps where it was
        recorded (a step it had no gradient on is a gap: NaN)."""
        out = []
        for name in names:
            steps, values = [], []
            for step, held, rows, grad, used in self.steps:
                k = self._position(held, rows, name)
                if k is not None:
                    steps.append(step)
                    values.append(grad[k] if used[k] else np.nan)
            if steps:
                out.append((name, np.array(steps), np.array(values, dtype=float)))
        return out

    def whole(self) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """The whole model's grad norm per kept step (the tensors with a gradient)."""
        if not self.steps:
            return []
        steps = np.array([s[0] for s in self.steps])
        values = np.array([float(np.sqrt(np.nansum(np.where(used, grad, 0.0) ** 2)))
                           for _, _, _, grad, used in self.steps])
        return [("the whole model", steps, values)]
