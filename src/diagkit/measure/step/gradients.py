"""How a step's gradients are observed: the strategy protocol and the hookless strategy.

Each tensor is observed by exactly one strategy (`strategy_plan`):

- `BackwardHooks` (`backward_hooks`): a hook on the tensor fires as autograd accumulates into
  it (what `used` means, and what DDP watches); the backward's gradients are measured when it
  ends, before anything (clipping, unscaling) rewrites .grad in place. Any loop, any process
  group.
- `OptimizerShare`: no hook. In the standard loop without a process group (see
  `LoopFacts.hookless_shares`) a held tensor's .grad is None until this step's backward sets
  it, so `used` and the fresh gradient are read from .grad as its first optimizer steps. One
  Python call per tensor per backward was a large part of observing models with many small
  tensors.

Both follow `GradientStrategy`, and queue norms on the `StepState`
(`fresh_norms.measure_fresh`); `fresh_norms.resolve_fresh` turns the read-back into exact
per-tensor values.
"""

from __future__ import annotations

import operator
from typing import Protocol

import numpy as np

from ..batched.buckets import Buckets, Layout
from .fresh_norms import measure_fresh
from .state import StepState

_GRAD_AND_FLAG = operator.attrgetter("grad", "requires_grad")


class GradientStrategy(Protocol):
    """How the fresh gradients (and `used`) of some tensors are observed during a step."""

    def attach(self, handles: list) -> None:
        """Set whatever hooks it needs, appending their handles (removed by the observer)."""

    def at_optimizer_step(self, i: int, st: StepState) -> None:
        """Optimizer `i` is about to step (its step pre-hook)."""


class OptimizerShare:
    """Optimizer `i`'s unhooked tensors `idx`, laid out once: the tensor objects, their layout
    (positions, bucket groups) and the rows whose lr is read. Right after a backward those
    objects are out of the CPU's caches, so a step touches each of them once (`take`)."""

    def __init__(self, observer, i: int, idx: np.ndarray, buckets: Buckets,
                 group_of: np.ndarray):
        self.obs, self.optimizer, self.idx = observer, i, idx
        self.first = int(idx[0])  # the whole share is read when this one is
        self.layout = Layout(idx.tolist(), buckets)
        self.tensors = [observer.tensors[k] for k in self.layout.ks]
        held = group_of[idx] >= 0
        self.lr_rows, self.lr_groups = idx[held], group_of[idx][held]

    def attach(self, handles: list) -> None:
        """No hooks: .grad is read as the optimizer steps."""

    def at_optimizer_step(self, i: int, st: StepState) -> None:
        if i == self.optimizer and not st.read[self.first]:
            self.take(st)

    def take(self, st: StepState) -> None:
        """As the optimizer steps: each .grad is this step's own gradient."""
        pairs = list(map(_GRAD_AND_FLAG, self.tensors))
        grads = [g for g, _ in pairs]
        present = np.fromiter([g is not None for g in grads], dtype=bool, count=len(grads))
        idx = self.idx
        st.read[idx] = True
        st.requires_grad[idx] = [f for _, f in pairs]
        st.used[idx] = present
        if len(self.lr_rows):
            st.lr[self.lr_rows] = self.obs.group_lrs()[self.lr_groups]
        measure_fresh(st, self.layout, grads, self.obs.zero_grad_expected)
        st.total_is_fresh.append(idx[present])  # nothing rewrote .grad: its norm is the fresh one
