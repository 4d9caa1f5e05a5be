"""Whether the wiring of a run changed since the last optimizer step, cheaply enough to ask at
every step of a whole-run watch (docs/whole-run.md, "The whole run").

The wiring is what the verdicts are made of and a long run changes: which tensors require
grad, which tensors each optimizer group holds (by identity), the model's parameters, and
whether a group's learning rate is 0. `Wiring.changes()` compares them with the last time it
was asked and says what changed, as events (`{"step", "kind", "what"}`).

Why it is cheap (issue 25; benchmarks/README.md, section I): every step asks only "is anything
different?", in C-level passes, and the events are worked out only when the answer is yes.

- The requires_grad flags: no hook says when one flips, so they are read at every step. The
  frozen tensors of plain type (`Tensor`, `Parameter`) are asked in one C call
  (`torch._C._any_requires_grad`: did any become trainable?); the others are read with one
  C-level `map` and compared as a tuple. This read, ~40-60 ns a tensor, is what the check costs.
- A group's members: compared by identity with the objects it held, which the check keeps (so
  no id can be reused by a new tensor), with one `map(operator.is_, ...)` per group. Never with
  `==`: a tensor's `==` is elementwise, and a new 1-element tensor of the same value would pass.
- The model's parameters are not walked at every step: torch's global module hooks
  (`register_module_parameter_registration_hook`, `..._module_registration_hook`) tell when
  any module registers a parameter or a submodule (a head replaced, a LoRA adapter added), and
  only then is the model walked again. A parameter removed with `del` sends no hook: it is
  seen at the next walk, when anything else changes.
"""

from __future__ import annotations

import functools
import hashlib
import operator

import torch
from torch.nn.modules import module as _module

from ..model.inventory import group_lr

_requires_grad = operator.attrgetter("requires_grad")
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # their requires_grad is the C getter's, no override


@functools.cache
def _any_requires_grad():
    """torch's C `any(t.requires_grad for t in args)`, or None where this torch lacks it or it
    answers otherwise than the attribute (checked once, on two tensors of our own)."""
    found = getattr(torch._C, "_any_requires_grad", None)
    try:
        yes, no = torch.zeros(1, requires_grad=True), torch.zeros(1)
        works = found is not None and found(no, no) is False and found(no, yes) is True
    except Exception:
        works = False
    return found if works else None


def _same_members(params, members: tuple) -> bool:
    """Whether a group's `params` hold `members`, the same objects in the same order: a member
    replaced, added, removed or moved in place (the list the same object) is a difference.
    By identity, one C-level pass; never `==` (a tensor's is elementwise)."""
    if type(params) is not list and type(params) is not tuple:
        params = tuple(params)
    return len(params) == len(members) and all(map(operator.is_, params, members))


class Wiring:
    """The wiring of `model` under `optimizers`, as of the last `changes()` (or creation).
    `release()` removes the module hooks; until then it is one flag set per registration."""

    def __init__(self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer],
                 registration_hooks: bool = True):
        """`registration_hooks` False (a compiled model: dynamo guards on torch's global
        module hooks, so setting or removing one recompiles every graph): no hook, and the
        model is walked at every `changes()` instead (a pass over its modules)."""
        self.model, self.optimizers = model, optimizers
        self._dirty = False
        self._hooked = registration_hooks
        self._handles = [_module.register_module_parameter_registration_hook(self._registered),
                         _module.register_module_module_registration_hook(self._registered)
                         ] if registration_hooks else []
        self._walk()
        self._hold_flags(tuple(map(_requires_grad, self._tensors)))
        self._hold_groups()
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

    def _hold_flags(self, flags: tuple) -> None:
        """Keep `flags` (one per tensor) and split the tensors for `_flags_same`: the frozen
        ones of plain type go to the one C call, the others to the compared tuple."""
        self._flags = flags
        asked = _any_requires_grad() is not None
        frozen, polled, polled_flags = [], [], []
        for tensor, flag in zip(self._tensors, flags):
            if asked and flag is False and type(tensor) in _PLAIN:
                frozen.append(tensor)
            else:
                polled.append(tensor)
                polled_flags.append(flag)
        self._frozen, self._polled, self._polled_flags = tuple(frozen), polled, tuple(polled_flags)

    def _flags_same(self) -> bool:
        """No tensor's requires_grad flipped: no frozen one became trainable, and the others
        read as they were. Exact: every tensor is in one of the two, read at every ask."""
        if self._frozen and _any_requires_grad()(*self._frozen):
            return False
        return tuple(map(_requires_grad, self._polled)) == self._polled_flags

    def _hold_groups(self) -> None:
        """Keep, per optimizer and group, the members (the objects: an id stays theirs) and
        whether the lr is 0; `_groups` says the same in ids (the events and the digest)."""
        self._held = [[(tuple(g["params"]), _lr_is_zero(g)) for g in opt.param_groups]
                      for opt in self.optimizers]
        self._groups = tuple(tuple((tuple(map(id, members)), zero) for members, zero in held)
                             for held in self._held)

    def take_groups(self) -> None:
        """Hold the optimizers' groups as they are now, saying nothing: the caller says the
        change (an optimizer replaced by a new one over the same tensors is one event, not a
        second "groups changed")."""
        self._hold_groups()
        self._digest = None

    def _groups_same(self) -> bool:
        """Every optimizer's groups hold what they held, by identity and in order, with the
        same lr-is-0: a few C-level compares per group, none per member in Python."""
        if len(self.optimizers) != len(self._held):
            return False
        for opt, held in zip(self.optimizers, self._held):
            groups = opt.param_groups
            if len(groups) != len(held):
                return False
            for group, (members, zero) in zip(groups, held):
                if _lr_is_zero(group) is not zero or not _same_members(group["params"], members):
                    return False
        return True

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
        """What changed since the last call, as events at `step` (empty: nothing). Each part
        is first asked whether it changed at all; only a yes works out what."""
        events, renamed = [], False
        if self._dirty or not self._hooked:
            self._dirty = False
            old_names, old_ids = self._names, self._ids
            self._walk()
            if self._ids != old_ids:
                events.append(_parameters_event(step, old_names, old_ids, self._names, self._ids))
                renamed = True  # the flags are taken afresh: other tensors, no flips to say
        if renamed or not self._flags_same():
            flags = tuple(map(_requires_grad, self._tensors))
            if not renamed:
                events += _flag_events(step, self._names, self._flags, flags)
            self._hold_flags(flags)
        if not self._groups_same():
            old = self._groups
            self._hold_groups()
            events += _group_events(step, old, self._groups) if self._groups != old else []
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
