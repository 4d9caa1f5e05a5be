"""The leaves of a step's autograd graph, and which of them are state rather than made in it.

Every leaf that receives a gradient is an `AccumulateGrad` node reachable from the loss. Most
are parameters; some are tensors made during the step: an activation made to require grad
(`enable_input_require_grads()`, which the HF `Trainer` calls for gradient checkpointing), an
adversarial input `x.requires_grad_()`, the detached inputs of a reentrant checkpoint. Those
are not state: nothing trains or saves them, and a fresh one appears every step.

`Persistence` tells them apart without keeping any of them alive (docs/unregistered.md):
- a leaf that lived on the model (its plain attributes) when observing began is state;
- any other leaf is a candidate, held by a weak reference only; it is state once a later
  observed step's graph reaches the very same object again (reused across steps). A tensor
  made during a step dies with that step's graph, so its weak reference does.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import torch

from .attribute_paths import Where, plain_tensors


def graph_leaves(roots) -> list[torch.Tensor]:
    """The leaves (AccumulateGrad variables) reachable from `roots` (grad_fn nodes), once each."""
    seen, stack, found = set(), [r for r in roots if r is not None], []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            found.append(variable)
        stack.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    return found


def nested_tensors(value, depth: int = 0):
    """The tensors in a forward's arguments or output (nested lists, tuples, dicts, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, (Mapping, list, tuple)):
        for v in (value.values() if isinstance(value, Mapping) else value):
            yield from nested_tensors(v, depth + 1)


class Persistence:
    """Which leaves outside the inventory are state: on the model before the first observed
    step, or reached again on a later step. Holds weak references only."""

    def __init__(self, model):
        self._model = model
        self._before: dict[int, tuple[Where, weakref.ref]] | None = None
        self._candidates: dict[int, weakref.ref] = {}

    def take_before(self) -> None:
        """What lives on the model's plain attributes now, before any observed step (weakly).
        Once: an observer attached again (a whole run's next window) keeps the first take; a
        tensor put on the model later is state from the step it is met again."""
        if self._before is not None:
            return
        self._before = {k: (where, weakref.ref(t))
                        for k, (where, t) in plain_tensors(self._model).items()}

    def where_before(self, t: torch.Tensor) -> Where | None:
        """Its path on the model if it was there before the first observed step, else None."""
        where, ref = (self._before or {}).get(id(t), (None, None))
        return where if ref is not None and ref() is t else None

    def pending(self) -> bool:
        """Whether a candidate of an earlier step is still alive (a later walk may meet it
        again); a dead one is forgotten."""
        self._candidates = {k: r for k, r in self._candidates.items() if r() is not None}
        return bool(self._candidates)

    def sort(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        """The leaves of this step that are state; the others become candidates (weakly)."""
        state = []
        for t in leaves:
            ref = self._candidates.get(id(t))
            if self.where_before(t) is not None or (ref is not None and ref() is t):
                self._candidates.pop(id(t), None)
                state.append(t)
            else:
                self._candidates[id(t)] = weakref.ref(t)
        return state
