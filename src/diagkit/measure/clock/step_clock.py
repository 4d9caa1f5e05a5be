"""Training steps of a loop diagkit does not run, told by the optimizers' own step hooks.

A step is one optimizer step: it ends when every watched optimizer has stepped since the last
step ended (each once in the usual loop; one optimizer stepping again first just makes that
step longer). So accumulation over micro-batches, `model.zero_grad()` or no zeroing at all,
clipping, schedulers and a loss scaler (whose skipped steps never call `optimizer.step()`) all
count as the user's loop counts them. Optimizers that step apart (each layer its own, trained
one after another) are each a step of their own once the others rest (`IDLE_AFTER`). Step `i`
is observed when `i % every == 0`: the
observer's step begins right after step `i - 1` ended, so it sees the whole of step `i`
(zeroing, forward, backward, the optimizer's update).

The clock never raises into the user's loop: if observing a step fails, it stops observing,
keeps the steps before, and reports the error through `on_done`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import torch

from .backward_ticks import BackwardTicks
from ..step.observer import Observer


# An optimizer that has not stepped while another stepped this many more times in one step is
# resting (forward-forward training: one layer's optimizer at a time): from then on a step
# ends when the optimizers not resting have stepped, until it steps again. A GAN's critic
# stepping 5 times per generator step stays one step.
IDLE_AFTER = 8
LONG_STEPS_KEPT = 32


class StepClock:
    """Counts the optimizer steps of `optimizers` and brackets the observed ones for
    `observer`. `on_step(index)` after each observed step; `on_done(error)` once, after
    `steps` observed steps (error None) or when observing failed (error: (message, traceback))."""

    def __init__(self, observer: Observer, optimizers: list[torch.optim.Optimizer], *,
                 steps: int, every: int, on_step: Callable[[int], None],
                 on_done: Callable[[tuple[str, str] | None], None]):
        self.obs, self.optimizers = observer, optimizers
        self.steps, self.every = steps, every
        self.on_step, self.on_done = on_step, on_done
        self.count = self.first = 0  # optimizer steps completed since the clock started
        self.observed = 0       # of them, observed
        self.observing = False  # the observer's step is open
        self._stepped: set[int] = set()
        self._repeats = 0              # steps of an optimizer again within the current step
        self.idle: set[int] = set()    # optimizers resting (not stepping while others do)
        self._handles: list[tuple[int, object]] = []  # (optimizer, handle)
        self._in_hook: int | None = None  # the optimizer whose post-hook is running
        self.calls = [0] * len(optimizers)  # each optimizer's own step() calls
        self._calls_in_step: dict[int, int] = {}
        self.long_steps: list[dict] = []  # steps spanning several calls of one optimizer
        self.ticks: BackwardTicks | None = None  # with no optimizer: steps end at backward ends

    def start(self) -> None:
        """Set the step hooks and open step 0 (it begins now)."""
        self._set_hooks()
        self._open(0, consecutive=False)

    def _set_hooks(self) -> None:
        """The optimizers' post-hooks; with no optimizer, the ends of backward
        (`measure.clock.backward_ticks`)."""
        for i, opt in enumerate(self.optimizers):
            self._handles.append((i, opt.register_step_post_hook(self._hook(i))))
        if not self.optimizers:
            self.ticks = BackwardTicks(self.obs.tensors, self._hook(None))
            self.ticks.attach()

    def step(self) -> None:
        """An explicit end of step (`watch.step()`, with no optimizer). The first call starts
        the count again: the steps told by backward ends until then were cut where the loop
        does not cut its steps (a micro-batch's backward), so they are forgotten; from then on
        the loop's own calls are the steps."""
        if not self.ticks.explicit:
            self.ticks.explicit = True
            if self.observing:
                self.obs.abort_step()
            self.obs.forget_recorded()
            self.count = self.first
            self.observed = 0
            self._open(self.count, consecutive=False)
            return
        self._hook(None)()

    def stop(self) -> None:
        """Remove the hooks; a step still open is dropped (it never finished).

        Called from inside one of its own hooks (the last observed step), that hook cannot be
        taken out of its optimizer's hook dict while torch iterates it if a later hook follows
        it there: it is made inert instead and removed by the next `stop()`.
        """
        keep = []
        for i, handle in self._handles:
            hooks = handle.hooks_dict_ref()
            if i == self._in_hook and hooks is not None and handle.id in hooks \
                    and next(reversed(hooks)) != handle.id:
                hooks[handle.id] = _inert
                keep.append((i, handle))
            else:
                handle.remove()
        self._handles = keep
        if self.ticks is not None:
            self.ticks.detach()
        if self.observing:
            self.observing = False
            self.obs.abort_step()

    @property
    def hooks_left(self) -> int:
        """Hooks of the clock still in an optimizer (0 once stopped outside its own hooks)."""
        return len(self._handles)

    def _hook(self, i: int) -> Callable:
        def hook(*_args):
            self._in_hook = i
            try:
                self._stepped_once(i)
            except Exception as exc:  # never into the user's loop: stop, keep what was recorded
                self.observing = False
                self.on_done((f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            finally:
                self._in_hook = None
        return hook

    def _stepped_once(self, i: int | None) -> None:
        """Optimizer `i` stepped: tell the observer; a step ends once every optimizer did.
        (None: no optimizer, a backward or `step()` ended the step.)"""
        if i is None:
            self._tick()
            return
        if self.observing:
            self.obs.step_ended(i)
        self.calls[i] += 1
        self._calls_in_step[i] = self._calls_in_step.get(i, 0) + 1
        if i in self._stepped:
            self._repeats += 1
            if self._repeats >= IDLE_AFTER:  # the others rest: each of i's steps is a step
                self.idle |= set(range(len(self.optimizers))) - self._stepped
        self._stepped.add(i)
        self.idle.discard(i)
        if len(self._stepped | self.idle) == len(self.optimizers):
            if self.observing:
                self.obs.resting = set(self.idle)
            self._stepped.clear()
            self._repeats = 0
            self._note_span()
            self._tick()

    def _note_span(self) -> None:
        """A step that took more than one `step()` of some optimizer (a GAN's critic, the
        first step of each turn when optimizers take turns) is said, so `optimizer_steps`
        (the watch's steps) is not read as the optimizers' calls (docs/result.md). The first
        `LONG_STEPS_KEPT` are listed."""
        most = max(self._calls_in_step.values(), default=1)
        self._calls_in_step = {}
        if most > 1 and len(self.long_steps) < LONG_STEPS_KEPT:
            self.long_steps.append({"step": self.count, "calls": most})

    def _tick(self) -> None:
        """A step ended: record it if observed, then open the next observed one."""
        index, was_observing = self.count, self.observing
        self.count += 1
        if was_observing:
            self.observing = False
            if self.obs.end_step():  # a dropped step is not counted: the next one is observed
                self.observed += 1
                self.on_step(index)
                if self.observed >= self.steps:
                    self.on_done(None)
                    return
            else:
                self._open(self.count, consecutive=True)
                return
        if self.count % self.every == 0:
            self._open(self.count, consecutive=was_observing)

    def _open(self, index: int, consecutive: bool) -> None:
        self.obs.begin_step(index, consecutive=consecutive)
        self.observing = True


def _inert(*_args) -> None:
    """Stands in for a removed hook until torch has finished iterating its hook dict."""
