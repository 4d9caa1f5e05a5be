"""Hookless observation earned at run time, in a loop diagkit does not run (`diagkit.watch`).

diagkit's own standard loop reads each optimizer's tensors from .grad as it steps, with no
hook (`OptimizerShare`), because that loop guarantees that every held .grad is None until the
step's one backward sets it and that nothing rewrites it before the step. A user's loop
promises nothing, so an `EarnedShare` starts with a hook on each tensor and looks, in what
the hooks saw, for the same facts. After `EARN_AFTER` observed steps that show them, with the
same gradient versions each time, the hooks of the tensors that had a gradient in them are
removed (a Python call per tensor and backward was most of watch's cost on models of many small
tensors: `benchmarks/README.md`). A tensor with no gradient in those steps (a branch not taken
yet, a layer waiting for its turn) has no version to check a later .grad against: it keeps its
hook, so the step its first gradient comes is observed as any hooked one, not dropped. A share
none of whose tensors had a gradient yet stays hooked and earns later, with those that have.

From then on each step must still show them, checked cheaply as the optimizer steps:

- every .grad present is a new tensor, not the one the optimizer saw at the last observed step
  (held by a weak reference): the loop set it to None in between, so a .grad now was made by
  this step's backward (`used`) and carries nothing over;
- every .grad present has the version it had in the earning steps: nothing accumulated into
  it (micro-batches) or rewrote it (clipping, unscaling) since backward made it, so its norm is
  the fresh gradient's.

A step that fails a check cannot be attributed (its backward ran without hooks): it is not
recorded (`StepState.dropped`, listed in the diagnosis' `meta["dropped_steps"]`), the hooks
come back, and the share is never earned again in that watch.
"""

from __future__ import annotations

import operator
import weakref

import numpy as np

from .backward_hooks import BackwardHooks
from .gradients import OptimizerShare
from .state import StepState

EARN_AFTER = 2  # observed steps that must show the standard loop's facts
_GRAD = operator.attrgetter("grad")


class EarnedShare(OptimizerShare):
    """Optimizer `i`'s tensors `idx` (no earlier optimizer holds them): hooked by `hooks`
    until earned, then read from .grad while every step still shows the standard loop."""

    def __init__(self, observer, i: int, idx: np.ndarray, buckets, group_of,
                 hooks: BackwardHooks, handles: list):
        super().__init__(observer, i, idx, buckets, group_of)
        self._layout_args = (buckets, group_of)  # to lay out the earned part again
        self.hooks, self.handles = hooks, handles
        self.active = False   # hooks removed: observed from .grad
        self.lapsed = False   # a step failed the checks: hooked for good
        self.clean = 0        # consecutive observed steps that showed the facts
        self.versions: list[int] | None = None  # per position; -1: never seen with a .grad
        self._seen: list = []  # per position: a weak reference to the .grad last seen

    def at_optimizer_step(self, i: int, st: StepState) -> None:
        if not self.active or i != self.optimizer or st.read[self.first]:
            return  # while hooked, the observer reads these tensors as any others
        grads = list(map(_GRAD, self.tensors))
        if self._still_standard(grads):
            self.take(st)
            self._remember(grads)
        else:
            self._lapse(st)

    def judge_step(self, st: StepState) -> None:
        """A hooked step was recorded: count it towards earning if it showed the facts."""
        if self.active or self.lapsed:
            return
        versions = self._clean_versions(st)
        if versions is None or (self.versions is not None and any(
                a != b for a, b in zip(versions, self.versions) if a >= 0 and b >= 0)):
            self.clean, self.versions = 0, versions
            return
        self.versions = versions if self.versions is None else [
            max(a, b) for a, b in zip(versions, self.versions)]
        self.clean += 1
        if self.clean >= EARN_AFTER:
            self._earn()

    def _earn(self) -> None:
        """Read without hooks the tensors whose gradient version is known; the rest (never a
        gradient in the earning steps: -1) keep their hooks, since a first .grad on one of them
        could not be told from one accumulated into or rewritten."""
        known = {k: v for k, v in zip(self.layout.ks, self.versions) if v >= 0}
        if not known:
            return  # nothing to check a .grad against yet: still hooked, still earning
        if len(known) < len(self.layout.ks):
            OptimizerShare.__init__(self, self.obs, self.optimizer,
                                    np.array(sorted(known), dtype=np.int64), *self._layout_args)
        self.versions = [known[k] for k in self.layout.ks]
        self.hooks.unhook(self.layout.ks)
        self._remember(list(map(_GRAD, self.tensors)))
        self.active = True

    def _clean_versions(self, st: StepState) -> list[int] | None:
        """The version of each tensor's .grad (-1: none), if the step showed the standard
        loop's facts for every tensor of the share, else None."""
        if st.backwards != 1 or st.in_closure or st.rewritten:
            return None  # accumulation, a GAN's second pass, a closure, an unscaled .grad
        ks = self.layout.ks
        if any(k in st.carried or k in st.total_norms for k in ks):
            return None  # landed on an old .grad, or .grad rewrote / stale at the step
        versions = []
        for k, used in zip(ks, st.used[ks].tolist()):
            if not used:
                versions.append(-1)
            elif k in st.grad_versions:
                versions.append(st.grad_versions[k][1])
            else:
                return None
        return versions

    def _still_standard(self, grads: list) -> bool:
        seen, versions = self._seen, self.versions
        for p, g in enumerate(grads):
            if g is None:
                continue
            old = seen[p]
            if (old is not None and old() is g) or g._version != versions[p]:
                return False
        return True

    def _remember(self, grads: list) -> None:
        self._seen = [None if g is None else weakref.ref(g) for g in grads]

    def _lapse(self, st: StepState) -> None:
        """The loop stopped behaving as the standard one: drop this step, hook again."""
        st.dropped = ("the loop stopped resetting .grad to None before each backward, or "
                      "rewrote .grad before the step, while it was read without hooks")
        self.active, self.lapsed = False, True
        self.hooks.attach(self.handles, self.layout.ks)
        self._seen = []
