"""Whether the wiring of a run changed since the last optimizer step, cheaply enough to ask at
every step of a whole-run watch (docs/whole-run.md, "The whole run").

The wiring is what the verdicts are made of and a long run changes: which tensors require
grad, which tensors each optimizer group holds (by identity), the model's parameters, and
whether a group's learning rate is 0. `Wiring.changes()` compares them with the last time it
was asked and says what changed, as events (`{"step", "kind", "what"}`).

Why it is cheap: the requires_grad flags and the groups' member ids are read with C-level
`map`s over cached lists and compared as tuples. The model's parameters are not walked at
every step: torch's global module hooks (`register_module_parameter_registration_hook`,
`..._module_registration_hook`) tell when any module registers a parameter or a submodule
(a head replaced, a LoRA adapter added), and only then is the model walked again. A parameter
removed with `del` sends no hook: it is seen at the next walk, when anything else changes.
"""

from __future__ import annotations

import hashlib
import operator

import torch
from torch.nn.modules import module as _module

from .inventory import group_lr

_requires_grad = operator.attrgetter("requires_grad")


class Wiring:
    """The wiring of `model` under `optimizers`, as of the last `changes()` (or creation).
    `release()` removes the module hooks; until then it is one flag set per registration."""

    def __init__(self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]):
        self.model, self.optimizers = model, optimizers
        self._dirty = False
        self._handles = [_module.register_module_parameter_registration_hook(self._registered),
                         _module.register_module_module_registration_hook(self._registered)]
        self._walk()
        self._groups = self._group_facts()
        self._flags = tuple(map(_requires_grad, self._tensors))
        self._digest: int | None = None

    def _registered(self, *_args):
        """Some module registered a parameter or a submodule: walk the model at the next ask."""
        self._dirty = True

    def release(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _walk(self) -> None:
        """The model's unique parameters, by name, as the inventory takes them."""
        seen, names, tensors = set(), [], []
        for name, tensor in self.model.named_parameters():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                names.append(name)
                tensors.append(tensor)
        self._names, self._tensors = names, tensors  # held: their ids stay theirs
        self._ids = tuple(map(id, tensors))

    def _group_facts(self) -> tuple:
        """Per optimizer, per group: the member ids in order, and whether its lr is 0."""
        return tuple(tuple((tuple(map(id, g["params"])), _lr_is_zero(g)) for g in o.param_groups)
                     for o in self.optimizers)

    def digest(self) -> int:
        """The wiring as a number equal on two processes wired alike: names, flags, and group
        members by their position among the model's tensors (ids differ across processes)."""
        if self._digest is None:
            position = {i: k for k, i in enumerate(self._ids)}
            groups = tuple(tuple((tuple(position.get(m, -1) for m in members), zero)
                                 for members, zero in opt) for opt in self._groups)
            said = repr((self._names, self._flags, groups)).encode()
            self._digest = int.from_bytes(hashlib.blake2b(said, digest_size=7).digest(), "big")
        return self._digest

    def changes(self, step: int) -> list[dict]:
        """What changed since the last call, as events at `step` (empty: nothing)."""
        events = []
        if self._dirty:
            self._dirty = False
            old_names, old_ids = self._names, self._ids
            self._walk()
            if self._ids != old_ids:
                events.append(_parameters_event(step, old_names, old_ids, self._names, self._ids))
                self._flags = ()  # compared afresh below against the new tensors
        flags = tuple(map(_requires_grad, self._tensors))
        if flags != self._flags and len(flags) == len(self._flags):
            events += _flag_events(step, self._names, self._flags, flags)
        self._flags = flags
        groups = self._group_facts()
        if groups != self._groups:
            events += _group_events(step, self._groups, groups)
            self._groups = groups
        if events:
            self._digest = None
        return events


def _lr_is_zero(group: dict) -> bool:
    try:
        return group_lr(group) == 0.0
    except Exception:  # an lr that is not a number: not ours to judge here
        return False


def _names_said(names: list[str], limit: int = 3) -> str:
    """`a, b, c and 9 more`: a change names what it touched without a thousand names."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _flag_events(step: int, names: list[str], old: tuple, new: tuple) -> list[dict]:
    events = []
    for flag, word in ((True, "became trainable"), (False, "was frozen")):
        flipped = [n for n, a, b in zip(names, old, new) if a != b and b is flag]
        if flipped:
            events.append({"step": step, "kind": "requires_grad", "names": flipped,
                           "what": f"{_names_said(flipped)} {word} (requires_grad={flag})"})
    return events


def _parameters_event(step, old_names, old_ids, new_names, new_ids) -> dict:
    before, after = dict(zip(old_ids, old_names)), dict(zip(new_ids, new_names))
    added = [n for i, n in after.items() if i not in before]
    gone = [n for i, n in before.items() if i not in after]
    replaced = [n for n in added if n in set(gone)]
    added = [n for n in added if n not in replaced]
    gone = [n for n in gone if n not in replaced]
    parts = [f"{label} {_names_said(ns)}" for label, ns in
             (("replaced", replaced), ("added", added), ("removed", gone)) if ns]
    return {"step": step, "kind": "parameters", "names": replaced + added + gone,
            "what": "model parameters " + "; ".join(parts or ["reordered"])}


def _group_events(step: int, old: tuple, new: tuple) -> list[dict]:
    events = []
    for i, (before, after) in enumerate(zip(old, new)):
        if [m for m, _ in before] != [m for m, _ in after]:
            events.append({"step": step, "kind": "optimizer", "names": [],
                           "what": f"optimizer {i}'s groups changed ({len(before)} -> "
                                   f"{len(after)} groups, "
                                   f"{sum(len(m) for m, _ in before)} -> "
                                   f"{sum(len(m) for m, _ in after)} tensors)"})
        for j, ((_, zero_a), (_, zero_b)) in enumerate(zip(before, after)):
            if zero_a != zero_b:
                events.append({"step": step, "kind": "lr", "names": [],
                               "what": f"optimizer {i} group {j}'s lr "
                                       + ("reached 0" if zero_b else "is no longer 0")})
    if len(new) != len(old):
        events.append({"step": step, "kind": "optimizer", "names": [],
                       "what": f"{len(old)} -> {len(new)} optimizers"})
    return events
