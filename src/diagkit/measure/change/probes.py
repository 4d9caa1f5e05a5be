"""How a step's change of each tensor is measured: the `delta=` modes.

- `exact` (default): a snapshot buffer per tensor that can train (an optimizer holds it or it
  requires grad), allocated once and reused every step; the change is `before - after`
  computed in place. Exact `changed` and `delta_norm`; extra memory 1x those tensors' bytes.
  The frozen rest (held by no optimizer, not requiring grad) and integer or quantised storage
  are fingerprinted: exact `changed`, no copy (`diagkit.measure.change.split_probe`).
- `sampled`: for models that do not fit twice. Tensors of at most `sample` elements are
  snapshotted as in exact mode; larger ones get an integer fingerprint of their bits (exact
  changed/unchanged, see `diagkit.measure.change.fingerprint`) and a fixed random sample of `sample`
  positions whose change estimates `delta_norm` (scaled by sqrt(numel / sample)). Extra memory
  is at most about `sample * 12` bytes per tensor, whatever its size.
- `off`: as `sampled` without the samples: `delta_norm` and `update_ratio` are NaN,
  `changed` stays exact. Extra memory: only the small tensors' copies.

In every mode a tensor on the meta device is never read (it has no values): NaN norms,
`changed` False.

Every verdict reads `changed`, never the size of the change, so all three modes give the
same verdicts. A probe does not sync with the device during a step: `end()` queues device
scalars on a `Pending` that the recorder reads back once per step; only `resolve()` may look
again, at the rare tensor whose norm came out 0 or non-finite. `attach()` reads the norms back
once (which tensors hold NaN, inf or huge values: `change_parts` decides those element-wise),
and on the CPU, where reading is free, so does a `begin()` after unobserved steps.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from ...core.options import DEFAULTS, delta_mode
from ..batched.readback import Pending
from .sampled_probe import FingerprintProbe
from .split_probe import SplitProbe


class Probe(Protocol):
    """How the observer measures each step's change. Called in this order only:
    `attach()`, then per observed step `begin()` -> (the step runs) -> `end()` -> `resolve()`,
    and `detach()` once at the end. Between `end()` and `resolve()` the observer reads the
    `Pending` back (one host transfer for the whole step); `resolve()` returns three arrays
    aligned with the observed tensors: (delta_norm, changed, update_ratio).

    `checksum_of` (set by the observer when ranks are compared): tensors whose value checksum
    is wanted after the step. `end()` may take some in passing, as `kernels.checksum` takes
    them, into `checksums` (index -> value); the observer takes the rest itself."""

    checksum_of: set[int]
    checksums: dict[int, torch.Tensor]

    def attach(self) -> None:
        """Allocate what every step reuses (snapshot buffers, sample positions)."""

    def begin(self, consecutive: bool = False) -> None:
        """Take the values before the step. `consecutive`: nothing ran since the last `end()`
        (or, before the first step, since `attach()`), so what that took still holds (and
        need not be taken again)."""

    def end(self, pending: Pending) -> None:
        """Queue this step's device scalars on `pending`; never sync with the device."""

    def resolve(self, got: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(delta_norm, changed, update_ratio) of every tensor, from the read-back `got`."""

    def detach(self) -> None:
        """Free everything `attach()` allocated."""

    def allocated_bytes(self) -> int:
        """The bytes of the buffers `attach()` allocated and every step reuses."""


def make_probe(mode: str, tensors: list[torch.Tensor], likely_static: set[int],
               sample: int = DEFAULTS["sample"], frozen: set[int] = frozenset(),
               memory_budget: float = DEFAULTS["memory_budget"]) -> Probe:
    """The probe of a `delta=` mode. `likely_static`: tensors whose change is expected to be
    exactly zero (frozen, or held by no optimizer), checked for it in the step's read-back.
    `frozen`: held by no optimizer and not requiring grad, which exact mode fingerprints
    instead of copying; `memory_budget`: exact mode's share of a CUDA device's free memory."""
    delta_mode(mode, error=ValueError)
    if mode == "exact":
        return SplitProbe(tensors, set(frozen), likely_static, memory_budget)
    return FingerprintProbe(tensors, likely_static, sample, estimate=mode == "sampled")
