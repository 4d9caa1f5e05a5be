"""`delta="exact"` at the memory of what trains: snapshots for what can train, fingerprints for
the rest (see `diagkit.measure.change.probes` for the protocol every probe follows).

A parameter-efficient fine-tune trains well under 1 % of a large frozen model. Copying the
frozen base every step would cost 1x the whole model, on a GPU exactly the memory its user
lacks. So exact mode splits the tensors (`split`):

- snapshot-and-subtract (`ExactProbe`): every tensor an optimizer holds or that requires grad,
  holding float values: exact `changed`, `delta_norm` and `update_ratio`;
- fingerprint (`fingerprint.Prints`): a tensor no optimizer holds and that does not require
  grad (the frozen base), and integer or quantised storage of any kind. `changed` stays exact
  (the fingerprint's bound: docs/cost.md, "Cost of observation"; a float tensor's values are
  printed, so -0.0 for +0.0 or another NaN is no change, as in a snapshot), so every verdict, which
  reads `changed` only, stays the same, `frozen_but_changing` included. `delta_norm` is 0 when
  the print is unchanged and NaN (not measured) when it changed; `update_ratio` is NaN;
- never read: a tensor on the meta device (no values): NaN norms, `changed` False.

The frozen base is not read at every step (`FrozenWindow`): once when observing begins and
once when it ends, so its per-step cost is nothing; a change between the two stays exact but
is dated only to the window (docs/cost.md, "When the frozen base is read").

On CUDA the snapshots are first checked against `memory_budget`, a fraction of the device's
free memory: past it the largest tensors are fingerprinted instead (`over_budget`, a pure
function), and one line says so through `logging.getLogger("diagkit")`.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from ...core.format import human_bytes
from ...core.options import DEFAULTS
from .exact_probe import ExactProbe
from .fingerprint import Fingerprinter, Prints, prints_differ, stored_as_code
from ..batched.readback import Pending

log = logging.getLogger("diagkit")


@dataclasses.dataclass(frozen=True)
class Split:
    """Which tensors exact mode snapshots, fingerprints, and cannot read (meta), by index."""

    snapshot: list[int]
    prints: list[int]
    meta: list[int]


def split(tensors: list[torch.Tensor], frozen: set[int], values: bool = True) -> Split:
    """The exact mode's split of `tensors` (indices in order). `frozen`: held by no optimizer
    and not requiring grad. `values=False` plans for meta tensors as if they were materialised
    (a dry run's count of what a real run would allocate), reading only shapes and dtypes."""
    snap, prints, meta = [], [], []
    for k, t in enumerate(tensors):
        if values and t.device.type == "meta":
            meta.append(k)
        elif k in frozen or stored_as_code(t):
            prints.append(k)
        else:
            snap.append(k)
    return Split(snap, prints, meta)


def snapshot_bytes(tensors: list[torch.Tensor], indices) -> int:
    """The bytes snapshots of `tensors[indices]` take (shapes and dtypes only: meta works)."""
    return sum(tensors[k].numel() * tensors[k].element_size() for k in indices)


def over_budget(sizes: list[int], budget: float) -> list[int]:
    """Positions in `sizes` (bytes) to fingerprint so that the rest fit in `budget` bytes:
    the largest first (ties: the later position first), as few as that takes."""
    total, out = sum(sizes), []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], -i)):
        if total <= budget:
            break
        out.append(i)
        total -= sizes[i]
    return sorted(out)


def budgeted(t: torch.Tensor) -> bool:
    """Whether a tensor's snapshot is checked against `memory_budget`: on a CUDA device."""
    return t.device.type == "cuda"


def free_device_bytes(device: torch.device) -> int:
    """Free memory of a CUDA device now, as the driver reports it."""
    return torch.cuda.mem_get_info(device)[0]


class SplitProbe:
    """`delta="exact"`: an `ExactProbe` over the snapshotted tensors and `Prints` over the
    fingerprinted ones (module docstring), merged in the tensors' order."""

    def __init__(self, tensors, frozen: set[int], likely_static: set[int],
                 memory_budget: float = DEFAULTS["memory_budget"]):
        self.tensors, self.likely_static = tensors, likely_static
        self.memory_budget = memory_budget
        self.split = split(tensors, frozen)
        self.over_budget: list[int] = []  # moved to the fingerprint by `memory_budget`
        # The frozen base, read at the window's edges only (the observer empties it where
        # each step is published as it is recorded: under a process group).
        self.window = FrozenWindow(tensors, [k for k in self.split.prints if k in frozen])
        self.exact = ExactProbe(self.tensors, self.split.snapshot, self.likely_static)
        self.prints = Prints(self.tensors, [], values=True)  # planned at `attach`
        self.checksum_of: set[int] = set()
        self.checksums: dict[int, torch.Tensor] = {}

    def attach(self) -> None:
        """The budget check (CUDA), then the snapshots and the per-step prints before the
        first step, and the frozen base's prints unless its window is open already (a whole
        run's observer attaches before each observed step)."""
        over = self._over_budget(self.split.snapshot)
        if over:
            self.over_budget = over
            self.exact = ExactProbe(self.tensors, [k for k in self.split.snapshot
                                                   if k not in set(over)], self.likely_static)
        windowed = set(self.window.indices)
        per_step = sorted(self.split.prints + self.over_budget)
        # Values, not bits: as a snapshot compares.
        self.prints = Prints(self.tensors, [k for k in per_step if k not in windowed],
                             values=True)
        self.exact.attach()
        self.prints.attach()
        self.window.open()

    def _over_budget(self, snapshot: list[int]) -> list[int]:
        """The CUDA tensors whose snapshots would pass `memory_budget` of their device's free
        memory (checked before anything is allocated), logged in one line."""
        by_device: dict[torch.device, list[int]] = {}
        for k in snapshot:
            if budgeted(self.tensors[k]):
                by_device.setdefault(self.tensors[k].device, []).append(k)
        out = []
        for device, ks in by_device.items():
            sizes = [snapshot_bytes(self.tensors, [k]) for k in ks]
            budget = self.memory_budget * free_device_bytes(device)
            moved = [ks[i] for i in over_budget(sizes, budget)]
            if moved:
                log.warning(
                    "diagkit: delta='exact' fingerprints %d tensors on %s (%s) instead of "
                    "copying them: their snapshots (%s) would pass memory_budget=%g of its "
                    "free memory (%s); their changed stays exact, their delta_norm is not "
                    "measured", len(moved), device, human_bytes(snapshot_bytes(
                        self.tensors, moved)), human_bytes(sum(sizes)), self.memory_budget,
                    human_bytes(int(budget)))
            out += moved
        return sorted(out)

    def allocated_bytes(self) -> int:
        """The bytes kept between steps: the snapshot buffers (the fingerprint's 1 MiB
        scratch per device and its prints of a few dozen bytes a tensor are not counted)."""
        return self.exact.allocated_bytes()

    def detach(self) -> None:
        """Free the buffers; the frozen base's window stays open (a few dozen bytes a
        tensor): a whole run's observer detaches between its observed steps."""
        self.exact.detach()
        self.prints.clear()

    def begin(self, consecutive: bool = False) -> None:
        self.exact.begin(consecutive)
        self.prints.begin(consecutive)

    def end(self, pending: Pending) -> None:
        self.exact.checksum_of = self.checksum_of
        self.exact.end(pending, "x")
        self.checksums = self.exact.checksums
        self.prints.end(pending, "fp")

    def resolve(self, got: dict):
        """(delta_norm, changed, update_ratio); `value_norm`: the norm before, where read."""
        n = len(self.tensors)
        delta, changed, ratio = np.full(n, np.nan), np.zeros(n, dtype=bool), np.full(n, np.nan)
        self.value_norm = np.full(n, np.nan)
        self.exact.resolve_into(got, "x", delta, changed, ratio, self.value_norm)
        at = np.array(self.prints.indices, dtype=np.int64)
        moved = self.prints.changed(got, "fp")
        changed[at] = moved
        delta[at] = np.where(moved, np.nan, 0.0)  # an unchanged print: exactly no change
        # The window's tensors are not read here: changed False, delta_norm NaN (not
        # measured) until `FrozenWindow.close` marks a change on the window's last step.
        return delta, changed, ratio


class FrozenWindow:
    """The frozen base checked over a window of steps, not at each (docs/cost.md, "When the
    frozen base is read"): fingerprinted when observing begins (`open`, at attach) and when it
    ends (`close`, called by whoever ends observing, before the steps are judged). A change
    between the two is exact (the fingerprint's bound) but dated only to the window: `close`
    marks it changed on the last recorded step (delta_norm NaN), so `frozen_but_changing`
    still fires. A tensor's version counter cannot stand in for the read (a write through
    `.data` or numpy does not bump it). `indices`: tensors no optimizer holds and that do not
    require grad when observing begins; empty: nothing to read."""

    def __init__(self, tensors: list[torch.Tensor], indices):
        self.tensors, self.indices = tensors, list(indices)
        self._before: list[np.ndarray | None] | None = None  # None: the window is not open
        self.reads = 0        # reads of the base so far (each of every tensor it still needs)
        self.seconds = 0.0    # the last read's duration

    def _take(self, positions: list[int]) -> list[np.ndarray]:
        """The value prints of `indices[positions]`, read back in one transfer per device.
        The fingerprint's scratch is not kept: reads are rare, and the memory is the run's."""
        start, fingerprint, pending = time.perf_counter(), Fingerprinter(), Pending()
        with torch.no_grad():
            prints = [fingerprint(self.tensors[self.indices[p]], values=True)
                      for p in positions]
        pending.add("fp", [])
        for one in prints:
            pending.add("fp", one)
        flat = pending.read()["fp"]
        bounds = np.cumsum([0] + [one.numel() for one in prints])
        self.reads += 1
        self.seconds = time.perf_counter() - start
        return [flat[a:b].copy() for a, b in zip(bounds[:-1], bounds[1:])]

    def open(self) -> None:
        """Take the prints the window starts from, of the tensors that have none yet (all of
        them at the first attach, none at a whole run's later ones)."""
        if self._before is None:
            self._before = [None] * len(self.indices)
        missing = [p for p, have in enumerate(self._before) if have is None]
        if missing:
            for p, taken in zip(missing, self._take(missing)):
                self._before[p] = taken

    def continue_from(self, other: "FrozenWindow") -> None:
        """Go on with `other`'s window (a whole run's next observer): a tensor in both, by
        identity, keeps its print and is not read again; the others are read at `open`."""
        if other._before is None:
            return
        had = {id(other.tensors[k]): (other.tensors[k], b)
               for k, b in zip(other.indices, other._before) if b is not None}
        self._before = [had[id(t)][1] if id(t) in had and had[id(t)][0] is t else None
                        for t in (self.tensors[k] for k in self.indices)]

    def close(self, records) -> set[int]:
        """Read the base once; mark each tensor whose print differs from the window's start
        changed on the last recorded step holding it (`StepRecords.mark_changed`). The window
        then goes on from this read, but for a change no recorded step could carry: the next
        read finds it again. Nothing is read with no recorded step (a whole run that ends
        right after a window closed: what follows its last observed step is not observed).
        Never raises: a base that cannot be read is one logged line. Returns the indices
        marked."""
        if self._before is None or not self.indices or not len(records):
            return set()
        try:
            after = self._take(list(range(len(self.indices))))
            moved = [p for p, (b, a) in enumerate(zip(self._before, after))
                     if b is not None and prints_differ(b, a, [len(b)], [len(a)])[0]]
            marked = records.mark_changed([self.indices[p] for p in moved])
        except Exception as exc:  # never into the user's loop
            log.warning("diagkit: the frozen base could not be read at the end of the "
                        "observed steps (%s: %s): a change of it since they began is not "
                        "seen", type(exc).__name__, exc)
            return set()
        self._before = [b if p in moved and self.indices[p] not in marked else a
                        for p, (b, a) in enumerate(zip(self._before, after))]
        return marked
