"""The hooks diagkit sets on a user's modules, made safe to save and to copy.

A module's hook dicts are part of its pickled and deep-copied state (`Module.__getstate__` is
its `__dict__`), so a hook there is reached by `torch.save(model)`, `pickle.dumps(model)` and
`copy.deepcopy(model)`. A plain closure or bound method would drag the observer along (or fail
to pickle), and a copy would keep observing forever. A `ModuleHook` instead:

- holds its owner by weak reference and calls `owner.<method>(...)`, checking
  `torch.compiler.is_compiling()` first (traced by dynamo, it is nothing);
- deep-copied together with its module, leaves no entry on the copy: the copy's entry is
  removed as the `copy.deepcopy` call ends (`_Prune`, kept in the copy's memo);
- pickled, becomes an inert `_Removed` that holds nothing of diagkit's and takes itself out of
  the loaded module's hook dicts at its first call (a pickle cannot drop a dict's entry).

Tensor and optimizer hooks need none of this: torch never saves or copies them (`Parameter`'s
`__reduce_ex__` / `__deepcopy__`, `Optimizer.__getstate__`).
"""

from __future__ import annotations

import weakref

import torch

# The hook dicts of a module that hold an entry under a forward (pre-)hook's id.
_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
          "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


def _drop(module, key: int) -> None:
    for name in _DICTS:
        hooks = getattr(module, "__dict__", {}).get(name)
        if hooks is not None:
            hooks.pop(key, None)


class _Removed:
    """A diagkit hook on a copy of a watched module: does nothing, and removes itself from the
    module it is called for."""

    __slots__ = ("key",)

    def __init__(self, key: int):
        self.key = key

    def __call__(self, module, *_args, **_kwargs):
        _drop(module, self.key)
        return None

    def __reduce__(self):
        return (_Removed, (self.key,))

    def __deepcopy__(self, memo):
        return _Removed(self.key)


class _Prune:
    """Kept in a `copy.deepcopy` call's memo, which is freed as the call returns: then takes
    the hook's entry out of the copy of its module."""

    __slots__ = ("module", "key")

    def __init__(self, module, key: int):
        self.module, self.key = module, key

    def __del__(self):
        _drop(self.module, self.key)


class ModuleHook:
    """A forward (pre-)hook calling `owner.<method>` (see the module's doc)."""

    __slots__ = ("_owner", "_method", "_module", "key", "__weakref__")

    def __init__(self, owner, method: str):
        self._owner = weakref.ref(owner)
        self._method = method
        self._module = None
        self.key = None

    def register(self, module: torch.nn.Module, register, **kwargs):
        """`register(self, **kwargs)` (a bound `register_forward_hook` or `..._pre_hook` of
        `module`); returns its handle."""
        handle = register(self, **kwargs)
        self._module, self.key = weakref.ref(module), handle.id
        return handle

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # traced by dynamo: nothing (no guard on diagkit)
            return None
        owner = self._owner()
        if owner is None:
            return None
        return getattr(owner, self._method)(*args, **kwargs)

    def __reduce__(self):
        return (_Removed, (self.key,))

    def __copy__(self):
        return _Removed(self.key)

    def __deepcopy__(self, memo):
        module = None if self._module is None else self._module()
        copied = memo.get(id(module)) if module is not None else None
        if copied is not None and copied is not module:
            memo[("diagkit.measure.model.hook_ref", id(self))] = _Prune(copied, self.key)
        return _Removed(self.key)
