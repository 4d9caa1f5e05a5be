"""Whether a rank's optimizers ever step, and how many backward passes it ran before they did.

Under a process group this is what tells a rank that is alive but never calls
`optimizer.step()` (`if rank != 1: opt.step()`, a rank that only runs forward and backward)
from one that died or hangs (`diagkit.run.gather`): a rank that never steps observes no step,
so without this count it would look exactly like a silent one.

Until the first optimizer step, each trainable tensor carries one post-accumulate hook: the first
that fires in a backward queues a callback on autograd's engine, which runs once that whole
backward has finished (as `measure.backward_ticks` tells a step's end), and reports it. The
optimizers' step *pre*-hooks report the first step as it begins, so a slow first step is never
taken for no step at all. After it nothing is counted: every hook is removed at the next
backward's end (not inside the optimizer's hook loop, which torch is iterating then) or at
`close()`. The hooks hold this object by weak reference only, and are removed when it is
collected: a watch dropped without `close()` leaves none behind. Like every hook of diagkit's,
they do nothing where dynamo traces them, and never raise into the user's loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.autograd import Variable


class FirstStep:
    """Counts the backward passes into `tensors` until one of `optimizers` first steps.
    `on_change(backwards, stepped)` after each counted backward and at the first step; it may
    raise (a store gone at the process's end): counting then stops, silently."""

    def __init__(self, tensors: list[torch.Tensor], optimizers: list[torch.optim.Optimizer],
                 on_change: Callable[[int, bool], None]):
        self.backwards = 0      # backward passes that ended before the first optimizer step
        self.stepped = False    # an optimizer's step() began
        self.queued = False     # this backward's end is queued
        self.broken = False     # `on_change` raised: counting stopped, the count is not whole
        self._on_change = on_change
        me = weakref.ref(self)

        def accumulated(_tensor) -> None:
            alive = me()
            if alive is None or alive.queued or torch.compiler.is_compiling():
                return
            try:
                Variable._execution_engine.queue_callback(ended)
                alive.queued = True
            except Exception:  # not inside a backward: not counted, never raised
                pass

        def ended() -> None:
            alive = me()
            if alive is not None:
                alive.queued = False
                alive._ended()

        def stepping(*_args) -> None:
            alive = me()
            if alive is not None and not torch.compiler.is_compiling():
                alive._stepping()

        self._handles: list = []
        self._finalizer = weakref.finalize(self, _remove, self._handles)
        try:
            self._handles += [t.register_post_accumulate_grad_hook(accumulated)
                              for t in tensors if t.requires_grad and t.is_leaf]
            self._handles += [opt.register_step_pre_hook(stepping) for opt in optimizers]
        except BaseException:
            self.close()
            raise

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def close(self) -> None:
        """Remove every hook (safe to call again; never from inside an optimizer's step)."""
        self._finalizer()

    def _ended(self) -> None:
        if self.stepped or self.broken:  # nothing left to count: every hook comes off
            self.close()
            return
        self.backwards += 1
        self._tell()

    def _stepping(self) -> None:
        if not self.stepped:
            self.stepped = True
            self._tell()

    def _tell(self) -> None:
        try:
            self._on_change(self.backwards, self.stepped)
        except Exception:  # never into the user's loop; the next backward's end lets go
            self._on_change, self.broken = _nothing, True


def _remove(handles: list) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


def _nothing(*_args) -> None:
    pass
