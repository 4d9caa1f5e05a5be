"""The step clock of a whole-run watch (`steps=None`): it counts every optimizer step and
lets the run decide, at the end of each, whether the next one is observed and by which
observer (docs/whole-run.md, "The whole run").

Between observed steps only the clock's own step post-hooks stay on the optimizers: the
observer's hooks (tensor hooks, pre-hooks, the probe's copies) are attached just before a step
that will be observed, and removed after it, unless the next step is observed by the same
observer too (its buffers are then kept, as a short watch keeps them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..step.observer import Observer
from .step_clock import StepClock

# plan(index, recorded) -> the observer of step index + 1, or None (not observed).
Plan = Callable[[int, bool], "Observer | None"]


class RunClock(StepClock):
    """A `StepClock` with no end of its own: `plan` picks each next observed step."""

    def __init__(self, observer: Observer, optimizers: list[torch.optim.Optimizer], *,
                 plan: Plan, on_done: Callable[[tuple[str, str] | None], None],
                 first_step: int = 0):
        super().__init__(observer, optimizers, steps=0, every=1, on_step=lambda _i: None,
                         on_done=on_done)
        self.plan = plan
        self.count = self.first = first_step

    def start(self) -> None:
        """Set the step hooks and observe the first step (it begins now)."""
        self._set_hooks()
        self.obs.attach()
        self._open(self.count, consecutive=False)

    def stop(self) -> None:
        super().stop()
        if self.obs is not None:
            self.obs.detach()

    def swap(self, new: torch.optim.Optimizer, replaced: list[int]) -> bool:
        """`new` steps for the first time, inside the step in progress: it takes the place of
        the optimizers at `replaced` (none: it joins them), in the clock's list in place (the
        watch, its wiring and its next observer share that list). Its post-hook, set now,
        still runs in this step, so the step ends as the loop's steps do. The step in progress
        was observed with the old optimizers' facts: it is aborted, and True says so."""
        aborted = self.observing
        if aborted:
            self.observing = False
            self.obs.abort_step()
        for _i, handle in self._handles:  # set again below: positions may shift
            handle.remove()
        calls = {id(o): c for o, c in zip(self.optimizers, self.calls)}
        gone = {id(self.optimizers[i]) for i in replaced}
        at = min(replaced) if replaced else len(self.optimizers)
        self.optimizers[:] = [o for o in self.optimizers if id(o) not in gone]
        self.optimizers.insert(min(at, len(self.optimizers)), new)
        self.calls = [calls.get(id(o), 0) for o in self.optimizers]
        self._calls_in_step = {}
        self._handles = []
        self._set_hooks()
        self._stepped, self._repeats, self.idle = set(), 0, set()
        return aborted

    def _tick(self) -> None:
        """A step ended: record it if observed, let the run plan the next, attach for it."""
        index, was_observing = self.count, self.observing
        self.count += 1
        recorded = False
        if was_observing:
            self.observing = False
            recorded = self.obs.end_step()
            self.observed += recorded
        current = self.obs
        following = self.plan(index, recorded)
        if following is not current:
            current.detach()
        if following is None:  # `current` stays, detached, for `stop()`
            return
        if not following.attached:
            following.attach()
        self.obs = following
        self._open(self.count, consecutive=following is current and was_observing)
