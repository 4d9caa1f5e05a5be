"""Optimizers a whole-run watch was not given, found at their first `step()` (docs/whole-run.md,
"An optimizer built during the run").

A loop that unfreezes a backbone often builds a new optimizer at that step (`opt =
SGD(...)`): the watched one never steps again, and a watch that followed only it would go
blind, judging nothing for the rest of the run while the new optimizer may leave the backbone
out. So a whole-run watch sets torch's *global* step pre-hook, which every optimizer of the
process runs first: one identity lookup per step for the optimizers already known; an
optimizer met for the first time is asked once whether it holds any of the model's tensors.
If it does, `on_new(optimizer)` adopts it before its first update (its own hooks, added now,
still run in this step); if not, it is someone else's (a second model) and never looked at
again. An optimizer that first steps *inside* another's `step()` is a wrapper's inner one (a
Lookahead-style optimizer stepping its base): never adopted, or it would replace the very
optimizer that runs it (a global post-hook closes each step, so nesting is known). Nothing here
holds an optimizer alive: known ones are kept by weak reference.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.optim import optimizer as _optimizer


def holds_any(opt: torch.optim.Optimizer, ids: set[int]) -> bool:
    """Whether any group of `opt` holds a tensor whose id is in `ids` (by identity)."""
    return any(id(p) in ids for group in opt.param_groups for p in group["params"])


def shared(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    """Whether two optimizers hold a tensor in common (by identity): the newer then replaces
    the older, as a loop that rebuilds its optimizer means it to."""
    return holds_any(a, {id(p) for group in b.param_groups for p in group["params"]})


class NewOptimizers:
    """The global pre-hook. `model_ids()`: the ids of the tensors watched now (asked only for
    an optimizer met the first time); `on_new(opt)`: adopt it (the hook never raises: a
    failure there is `on_new`'s to report)."""

    def __init__(self, known: list[torch.optim.Optimizer], model_ids: Callable[[], set[int]],
                 on_new: Callable[[torch.optim.Optimizer], None]):
        self.model_ids, self.on_new = model_ids, on_new
        self.known: weakref.WeakSet = weakref.WeakSet(known)
        self._handles: list = []
        self._open: list[int] = []  # the optimizers inside their step() now, outermost first

    def attach(self) -> None:
        self._handles = [_optimizer.register_optimizer_step_pre_hook(self._pre_hook),
                         _optimizer.register_optimizer_step_post_hook(self._post_hook)]

    def detach(self) -> None:
        """Remove the global hooks (idempotent): nothing of the watch stays in torch."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre_hook(self, opt, _args, _kwargs) -> None:
        if torch.compiler.is_compiling():
            return
        if id(opt) in self._open:  # a step that raised never closed: start the count again
            self._open.clear()
        nested = bool(self._open)
        self._open.append(id(opt))
        if opt in self.known:
            return
        try:
            self.known.add(opt)
            if not nested and holds_any(opt, self.model_ids()):
                self.on_new(opt)
        except Exception:  # never into the user's step: this optimizer is simply not followed
            return

    def _post_hook(self, opt, _args, _kwargs) -> None:
        if self._open and self._open[-1] == id(opt):
            self._open.pop()
