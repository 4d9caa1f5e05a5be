"""The objects under the wrappers users hold: DDP, DataParallel, `torch.compile` and DeepSpeed
engine modules, accelerate's `AcceleratedOptimizer`, Lightning's `LightningOptimizer`.

`watch` is handed what the user's loop holds. Tensors are found by identity, so any wrapper
that keeps the same parameter objects is seen through; hooks go on the innermost optimizer,
because that is the one whose `step()` runs (a wrapper's own `step()` may skip it, as
accelerate's does on a step its scaler skipped or while accumulating). DeepSpeed's ZeRO
optimizer is the exception: the torch optimizer under it holds flat partitions, so the search
stops at ZeRO's and watches it through `measure.engines.zero.ZeroView`. Duck-typed: no framework
is imported. peft models are modules whose own names (`base_model.model.…`) are kept.
"""

from __future__ import annotations

import torch

from ...core.errors import DiagkitError
from .zero import ZeroView, is_zero, view_of

# attribute -> what a module wrapper keeps its wrapped module in
_MODULE_WRAPPERS = {"DistributedDataParallel": "module", "DataParallel": "module",
                    "OptimizedModule": "_orig_mod", "DeepSpeedEngine": "module"}


def unwrap_model(model) -> tuple[torch.nn.Module, list[str]]:
    """The innermost module, and the wrappers' class names from the outside in.

    A dict of modules (`{"encoder": enc, "decoder": dec}`, as the seq2seq tutorial keeps them,
    each with its own optimizer) is watched as one `ModuleDict` that holds each unwrapped
    module under its key: its tensors are named `encoder.…`, `decoder.…`. The ModuleDict
    only refers to the user's modules; it changes none of them."""
    if isinstance(model, dict):
        return _modules_by_key(model)
    if not isinstance(model, torch.nn.Module):
        raise DiagkitError(f"watch needs the model as a torch.nn.Module, got {type(model).__name__}")
    wrappers = []
    while type(model).__name__ in _MODULE_WRAPPERS:
        inner = getattr(model, _MODULE_WRAPPERS[type(model).__name__], None)
        if not isinstance(inner, torch.nn.Module):
            break
        wrappers.append(type(model).__name__)
        model = inner
    return model, wrappers


def _modules_by_key(models: dict) -> tuple[torch.nn.Module, list[str]]:
    if not models:
        raise DiagkitError("watch got an empty dict of modules: nothing to watch")
    inner, wrappers = {}, []
    for key, module in models.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise DiagkitError(f"watch's dict of modules needs identifier keys (they name the "
                               f"tensors), got {key!r}")
        if not isinstance(module, torch.nn.Module):
            raise DiagkitError(f"watch's dict of modules needs torch.nn.Module values, got "
                               f"{type(module).__name__} under {key!r}")
        inner[key], found = unwrap_model(module)
        wrappers += [w for w in found if w not in wrappers]
    return torch.nn.ModuleDict(inner), wrappers


def unwrap_optimizers(optimizer_or_list, model=None) -> list[torch.optim.Optimizer]:
    """The torch optimizers under what was passed: one, or a list/tuple of them; None (or an
    empty list) for a loop that updates its tensors by hand, or for a DeepSpeed engine passed
    as `model`, whose own optimizer it is."""
    if optimizer_or_list is None and type(model).__name__ == "DeepSpeedEngine":
        optimizer_or_list = getattr(model, "optimizer", None)
    if optimizer_or_list is None:
        return []
    items = (list(optimizer_or_list) if isinstance(optimizer_or_list, (list, tuple))
             else [optimizer_or_list])
    found = []
    for item in items:
        opt = _innermost(item)
        if is_zero(opt):
            opt = view_of(opt)
        if not isinstance(opt, (torch.optim.Optimizer, ZeroView)):
            raise DiagkitError("watch needs torch optimizers (or wrappers of one), got "
                               f"{type(item).__name__}")
        if any(opt is seen for seen in found):
            raise DiagkitError("the same optimizer was passed twice")
        found.append(opt)
    return found


def _innermost(opt):
    """Follow `.optimizer` (accelerate) and `._optimizer` (Lightning) to the torch optimizer,
    or to DeepSpeed's ZeRO optimizer."""
    for _ in range(8):
        if is_zero(opt):
            return opt
        inner = getattr(opt, "optimizer", None)
        if inner is None or inner is opt:
            inner = getattr(opt, "_optimizer", None)
        if inner is None or inner is opt or not hasattr(inner, "param_groups"):
            return opt
        opt = inner
    return opt


def compiled_entry(model) -> torch.nn.Module | None:
    """The `torch.compile` wrapper in `model`'s wrapper chain, if any: the module the loop
    calls that runs eagerly. A forward hook belongs there: on the module it compiles, dynamo
    would trace the hook, and its coming and going would recompile the graph."""
    for _ in range(8):
        if not isinstance(model, torch.nn.Module) or type(model).__name__ not in _MODULE_WRAPPERS:
            return None
        if type(model).__name__ == "OptimizedModule":
            return model
        model = getattr(model, _MODULE_WRAPPERS[type(model).__name__], None)
    return None


def compiled(model, entry=None) -> bool:
    """Whether dynamo compiles `model` or any module in it: a `torch.compile` wrapper (`entry`)
    or a module compiled in place (`module.compile()`). Then diagkit sets no global module
    hook: dynamo guards on them, and one set or removed recompiles every graph."""
    if entry is not None:
        return True
    return isinstance(model, torch.nn.Module) and any(
        getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
