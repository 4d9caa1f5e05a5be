"""Optimizer steps that did not happen (a loss scaler's skips), told from what is observed.

`torch.amp.GradScaler.step` never calls `optimizer.step()` when the scaled gradients hold inf
or NaN: that optimizer's step pre-hook does not fire. Nothing here imports or needs a scaler;
two observations stand for it:

- an optimizer whose pre-hook never fired in an observed step in which tensors it holds got
  gradients skipped that step (`Holdings.skipped`: the steps table's `skipped` column). A
  scaler's skip is that, with gradients holding inf or NaN (`nonfinite`) on the skipped step; a
  skip with finite gradients is a loop that did not call `step()` (an accumulation spread over
  several `train_step` calls, a conditional step);
- in a loop diagkit does not run (`diagkit.watch`) a step is one optimizer step actually taken,
  so a skipped one runs on into the next: the observed step then holds a backward whose
  gradients held inf or NaN, followed by one that began a new iteration of the loop: it found
  .grad reset to None (`zero_grad()`), or its gradients are finite again (an accumulating
  backward would add to the inf, so only a zeroing in between explains it). Each such pair is
  one skipped optimizer step (`merged_skips`), and what the skipped backward measured is not
  the recorded step's gradient. A non-finite backward the loop accumulates onto is the same
  iteration's: not counted.

Both are numpy work per step (no Python per tensor), and nothing when no step was skipped.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batched.kernels import max_abs
from .state import StepState

RESET_SAMPLE = 1024  # elements of .grad looked at to tell a zeroed one from an accumulated one


def reset_probe(grad: torch.Tensor | None) -> torch.Tensor | None:
    """What a backward finds in a .grad an earlier backward of the step made: None if it was
    reset to None, else max |.grad| over its first elements (0 when zeroed in place), queued
    for the step's one read-back: a zeroed .grad is all zero, an accumulated one almost never
    is over so many elements. One small kernel per backward, on one tensor."""
    if grad is None or grad.is_sparse:
        return None if grad is None else max_abs(grad)
    return max_abs(grad.detach().reshape(-1)[:RESET_SAMPLE])


class Holdings:
    """Which tensors each optimizer holds (`held_by[i]`: indices), as a boolean matrix."""

    def __init__(self, held_by: list[np.ndarray], n: int):
        self.held_by = held_by
        self.holds = np.zeros((len(held_by), n), dtype=bool)
        for i, ks in enumerate(held_by):
            self.holds[i, ks] = True

    def skipping(self, st: StepState) -> np.ndarray:
        """Per optimizer: it did not step, though tensors it holds got gradients this step."""
        if st.stepped is None or st.stepped.all():
            return np.zeros(len(self.held_by), dtype=bool)
        had = np.array([bool(st.used[ks].any()) for ks in self.held_by], dtype=bool)
        return ~st.stepped & had

    def skipped(self, st: StepState, skipping: np.ndarray) -> np.ndarray:
        """Per tensor: an optimizer holding it skipped the step and none holding it stepped."""
        if not skipping.any():
            return np.zeros(self.holds.shape[1], dtype=bool)
        return self.holds[skipping].any(axis=0) & ~self.holds[st.stepped].any(axis=0)


def merged_skips(st: StepState, l2: np.ndarray, zeroed: np.ndarray
                 ) -> tuple[int, np.ndarray | None]:
    """(optimizer steps skipped inside the step, and a mask over the read-back fresh norms `l2`
    of those measured by a backward whose step was skipped; None when none was). `zeroed`:
    the read-back `reset_probe`s of `st.resets`' tensors (in order).

    Each hooked backward's norms end at `st.backward_marks` in `st.fresh_norms`; norms queued
    after the last mark (an optimizer share read as it steps) count with the last backward.
    """
    marks = st.backward_marks
    if len(marks) < 2:
        return 0, None
    ends = np.cumsum([len(ks) for ks, _ in st.fresh_norms])
    bounds = [0] + [int(ends[m - 1]) if m else 0 for m in marks[:-1]] + [len(l2)]
    # Told by the float32 norms: an inf or NaN element makes its tensor's norm inf or NaN.
    bad = np.array([not np.isfinite(l2[a:b]).all() for a, b in zip(bounds, bounds[1:])])
    # Backward j + 1 began a new iteration: it found .grad reset, or it is finite again after
    # j was not (accumulating onto an inf would keep it). j overflowed before: skipped.
    probes = iter(zeroed.tolist())
    found = {j: (True if v is None else next(probes) == 0) for j, v in st.resets.items()}
    new = np.array([found.get(j, False) for j in range(1, len(bad))], dtype=bool) | ~bad[1:]
    skips = np.flatnonzero(bad[:-1] & new)
    if not len(skips):
        return 0, None
    stale = np.zeros(len(l2), dtype=bool)
    stale[:bounds[int(skips[-1]) + 1]] = True
    return len(skips), stale


def resting_rows(rows: list[dict], resting: set[int], used: np.ndarray) -> np.ndarray | None:
    """The tensors a step is recorded for when some optimizers rested in it (they stepped
    apart: `measure.clock.step_clock.IDLE_AFTER`): all but those held only by resting optimizers
    and given no gradient (another layer's turn, not a tensor left unused). None: all."""
    if not resting:
        return None
    out = np.zeros(len(rows), dtype=bool)
    for k, row in enumerate(rows):
        holders = {i for i, _ in row["memberships"]}
        out[k] = bool(holders) and holders <= resting and not used[k]
    return np.flatnonzero(~out) if out.any() else None
