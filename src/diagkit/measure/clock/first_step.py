"""Whether a rank's optimizers ever step, and how many backward passes it ran before they did.

Under a process group this is what tells a rank that is alive but never calls
`optimizer.step()` (`if rank != 1: opt.step()`, a rank that only runs forward and backward)
from one that died or hangs (`diagkit.run.diagnose.gather`): a rank that never steps observes no step,
so without this count it would look exactly like a silent one.

Until the first optimizer step, the ends of backward are told by `measure.clock.backward_ticks` (one
post-accumulate hook per trainable tensor, as a loop with no optimizer has its steps told), and
each is reported. The
optimizers' step *pre*-hooks report the first step as it begins, so a slow first step is never
taken for no step at all. After it nothing is counted: every hook is removed at the next
backward's end (not inside the optimizer's hook loop, which torch is iterating then) or at
`close()`. The hooks reach this object by weak reference only, and are removed when it is
collected: a watch dropped without `close()` leaves none behind. Like every hook of diagkit's,
they do nothing where dynamo traces them, and never raise into the user's loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from .backward_ticks import BackwardTicks


class FirstStep:
    """Counts the backward passes into `tensors` until one of `optimizers` first steps.
    `on_change(backwards, stepped)` after each counted backward and at the first step; it may
    raise (a store gone at the process's end): counting then stops, silently."""

    def __init__(self, tensors: list[torch.Tensor], optimizers: list[torch.optim.Optimizer],
                 on_change: Callable[[int, bool], None]):
        self.backwards = 0      # backward passes that ended before the first optimizer step
        self.stepped = False    # an optimizer's step() began
        self.broken = False     # `on_change` raised: counting stopped, the count is not whole
        self._on_change = on_change
        me = weakref.ref(self)

        def ended() -> None:
            alive = me()
            if alive is not None:
                alive._ended()

        def stepping(*_args) -> None:
            alive = me()
            if alive is not None and not torch.compiler.is_compiling():
                alive._stepping()

        self._ticks = BackwardTicks(tensors, ended)  # told as a no-optimizer loop's steps
        self._handles: list = []
        self._finalizer = weakref.finalize(self, _remove, self._ticks, self._handles)
        try:
            self._ticks.attach()
            self._handles += [opt.register_step_pre_hook(stepping) for opt in optimizers]
        except BaseException:
            self.close()
            raise

    @property
    def attached(self) -> bool:
        return self._ticks.attached or bool(self._handles)

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


def _remove(ticks: BackwardTicks, handles: list) -> None:
    ticks.detach()
    for handle in handles:
        handle.remove()
    handles.clear()


def _nothing(*_args) -> None:
    pass
