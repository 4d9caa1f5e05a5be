"""FSDP1 (`FullyShardedDataParallel`) with `use_orig_params=True`: the original tensors, observed
through the views FSDP makes of them (docs/distributed.md, "Engines: what is observed, what is
refused").

With `use_orig_params=True` the model keeps its own `nn.Parameter` objects, so optimizer
membership is still `is`, and names are the model's once FSDP's `_fsdp_wrapped_module.` is
taken out. Between steps each one is a view of this rank's slice of its unit's flat parameter
(1-D, empty on a rank that holds none of it), and so is its `.grad`, reduce-scattered. Inside
forward FSDP puts a view of the gathered flat parameter in the module's place, and autograd
delivers the gradient to that view, never to the parameter: so `ViewHooks` hooks each view as
its module's forward begins, and the usual per-tensor hook
(`measure.step.backward_hooks.BackwardHooks`) runs on it. Values and `.grad` are this rank's
slice, summed over the unit's process group as FSDP2's shards are (`measure.engines.shards`).
With `use_orig_params=False` the flat parameters replace the tensors: refused
(`measure.engines.refused`). Duck-typed on torch's own attributes.
"""

from __future__ import annotations

import dataclasses

import torch

from ...core.schema import FSDP1_SLICE

PLACEMENT = FSDP1_SLICE  # the params table's `placement` of an FSDP1 original tensor
_WRAPPED = "_fsdp_wrapped_module."  # the segment FSDP1 adds to every name under a unit


@dataclasses.dataclass(frozen=True)
class Slice:
    """What FSDP1 knows of one original tensor: its unit's process group and its shape."""

    group: object
    shape: tuple[int, ...]


def units(model: torch.nn.Module) -> list:
    """The FSDP1 units in `model` (itself included)."""
    return [m for m in model.modules() if type(m).__name__ == "FullyShardedDataParallel"]


def slices(model: torch.nn.Module) -> dict[int, Slice]:
    """id(original tensor) -> its `Slice`, for every unit with `use_orig_params=True`."""
    found = {}
    for unit in units(model):
        flat = getattr(unit, "_flat_param", None)
        if flat is None or not getattr(unit, "_use_orig_params", False):
            continue
        for param, shape in zip(getattr(flat, "_params", None) or (), flat._shapes):
            found[id(param)] = Slice(unit.process_group, tuple(shape))
    return found


def clean_name(name: str) -> str:
    """A name as the model declares it: FSDP1's wrapper segments taken out."""
    return name.replace(_WRAPPED, "")


class ViewHooks:
    """Hooks each FSDP1 original tensor's forward view with `hook_for(k)` as its module's
    forward begins, in observed steps (a forward pre-hook runs after FSDP has gathered its unit: inside the
    unit's own forward). Frozen tensors' views do not require grad: nothing to hook."""

    def __init__(self, model: torch.nn.Module, tensors: list, hook_for, active):
        index = {id(t): k for k, t in enumerate(tensors)}
        self.owners: dict[int, tuple[torch.nn.Module, list[tuple[str, int]]]] = {}
        for module in model.modules():
            attrs = [(a, index[id(p)]) for a, p in module._parameters.items()
                     if p is not None and id(p) in index]
            if attrs:
                self.owners[id(module)] = (module, attrs)
        self.hook_for, self.active = hook_for, active  # active(): a step is observed

    def attach(self, handles: list) -> None:
        for module, attrs in self.owners.values():
            handles.append(module.register_forward_pre_hook(self._pre(module, attrs)))

    def at_optimizer_step(self, i: int, st) -> None:
        """Nothing to read: the hooks on the views did it (`GradientStrategy`)."""

    def _pre(self, module, attrs):
        def pre(_module, _args):
            if not self.active():  # an unobserved step: nothing more than this call
                return
            for attr, k in attrs:
                view = module._parameters.get(attr)
                if isinstance(view, torch.Tensor) and view.requires_grad and not view.is_leaf:
                    view.register_hook(self.hook_for(k))
        return pre
