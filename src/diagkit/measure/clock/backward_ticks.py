"""Steps of a loop with no optimizer (hand-written updates, `p.data.add_(p.grad, alpha=-lr)`):
a step ends where each backward into the model's tensors ends (docs/watch.md, "Hand-written
updates").

No optimizer's step hook can tell the steps there, so one hook per trainable tensor stays on
(`register_post_accumulate_grad_hook`): the first one that fires in a backward queues a
callback on autograd's engine, which runs once that whole backward has finished (as DDP
learns that a backward is done). A loop that calls `watch.step()` says where its steps end
itself; from that call on, backward ends no longer end steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import Variable


class BackwardTicks:
    """Calls `on_end()` once at the end of each backward that reaches `tensors`."""

    def __init__(self, tensors: list[torch.Tensor], on_end: Callable[[], None]):
        self.tensors, self.on_end = tensors, on_end
        self.explicit = False    # the loop calls watch.step(): backward ends are not steps
        self._queued = False
        self._handles: list = []

    attached = property(lambda self: bool(self._handles), doc="Whether any hook is set.")

    def attach(self) -> None:
        for t in self.tensors:
            if t.requires_grad and t.is_leaf:
                self._handles.append(t.register_post_accumulate_grad_hook(self._accumulated))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _accumulated(self, _tensor) -> None:
        if self._queued or self.explicit or torch.compiler.is_compiling():
            return
        try:
            Variable._execution_engine.queue_callback(self._ended)
            self._queued = True
        except Exception:  # not inside a backward: not an end to tell, never raised
            pass

    def _ended(self) -> None:
        self._queued = False
        self.on_end()
