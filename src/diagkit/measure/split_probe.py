"""`delta="exact"` at the memory of what trains: snapshots for what can train, fingerprints for
the rest (see `diagkit.measure.probes` for the protocol every probe follows).

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

On CUDA the snapshots are first checked against `memory_budget`, a fraction of the device's
free memory: past it the largest tensors are fingerprinted instead (`over_budget`, a pure
function), and one line says so through `logging.getLogger("diagkit")`.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from ..core.format import human_bytes
from ..core.options import DEFAULTS
from .exact_probe import ExactProbe
from .fingerprint import Prints, stored_as_code
from .readback import Pending

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
        self._plan(self.split.snapshot, self.split.prints)
        self.checksum_of: set[int] = set()
        self.checksums: dict[int, torch.Tensor] = {}

    def _plan(self, snapshot: list[int], prints: list[int]) -> None:
        self.exact = ExactProbe(self.tensors, snapshot, self.likely_static)
        self.prints = Prints(self.tensors, prints, values=True)  # as a snapshot compares

    def attach(self) -> None:
        """The budget check (CUDA), then the snapshots and the prints before the first step."""
        over = self._over_budget(self.split.snapshot)
        if over:
            self.over_budget = over
            self._plan([k for k in self.split.snapshot if k not in set(over)],
                       sorted(self.split.prints + over))
        self.exact.attach()
        self.prints.attach()

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
        return delta, changed, ratio
