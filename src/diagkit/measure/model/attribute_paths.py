"""Where a tensor lives among a model's plain attributes (lists, tuples, dicts, plain objects,
modules that are not registered): `cells[0].weight_ih`, `mem_keys`, `memory['keys']`.

`.parameters()` and `.buffers()` see only registered tensors; this walk sees the rest, with a
depth bound, an object budget and a cycle guard. It names unregistered tensors and the tensors
an optimizer holds outside the model (`measure.model.unregistered`, `measure.model.inventory`), and tells
which tensors already lived on the model before a step began (docs/unregistered.md).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping

import torch

_MODULE_KEYS = frozenset(vars(torch.nn.Module()))  # nn.Module's own bookkeeping attributes
_DEPTH, _BUDGET = 6, 50_000

Where = tuple[str, str, str]  # (path, owning module's path, its class name)


def find_paths(model: torch.nn.Module | None, wanted: set[int]) -> dict[int, Where]:
    """id -> (path, owning module's path, its class name) for the tensors of `wanted`."""
    if not wanted:
        return {}
    return {k: where for k, (where, _) in
            _walk(model, lambda t: id(t) in wanted).items()}


def plain_tensors(model: torch.nn.Module | None) -> dict[int, tuple[Where, torch.Tensor]]:
    """Every tensor that requires grad and lives on the model outside its registered
    parameters (buffers included): id -> (where, the tensor). Taken as a watch attaches, it
    says which leaves of a later step are the model's state, not made during that step."""
    return _walk(model, lambda t: t.requires_grad)


def _walk(model, keep: Callable[[torch.Tensor], bool]) -> dict[int, tuple[Where, torch.Tensor]]:
    """The tensors `keep` accepts, reachable from `model`, each under the first path found."""
    found: dict[int, tuple[Where, torch.Tensor]] = {}
    if model is None:
        return found
    seen: set[int] = set()

    def take(t, path, owner_path, owner_type):
        if keep(t):
            found.setdefault(id(t), ((path, owner_path, owner_type), t))

    def module(mod, path, depth):
        for sub_path, sub in mod.named_modules(remove_duplicate=False):
            where = _join(path, sub_path)
            # An unregistered module's own parameters are unregistered too; a buffer that
            # requires grad is one anywhere.
            for key, p in [*(sub._parameters.items() if path else ()), *sub._buffers.items()]:
                if p is not None:
                    take(p, _join(where, key), where, type(sub).__name__)
            for key, value in vars(sub).items():
                if key not in _MODULE_KEYS:
                    walk(value, _join(where, key), where, sub, depth + 1)

    def walk(value, path, owner_path, owner, depth):
        if depth > _DEPTH or id(value) in seen or len(seen) > _BUDGET:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            take(value, path, owner_path, type(owner).__name__)
        elif isinstance(value, torch.nn.Module):
            module(value, path, depth)
        elif isinstance(value, Mapping):
            for k, v in list(value.items()):
                walk(v, f"{path}[{k!r}]", owner_path, owner, depth + 1)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]", owner_path, owner, depth + 1)
        elif not isinstance(value, (type, types.ModuleType, types.FunctionType,
                                    types.MethodType)):
            try:  # a plain object; one whose attributes cannot be listed is left alone
                items = list(vars(value).items())
            except Exception:
                return
            for k, v in items:
                walk(v, f"{path}.{k}", owner_path, owner, depth + 1)

    module(model, "", 0)
    return found


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a and b else a or b  # a dotted path; '' is the root
