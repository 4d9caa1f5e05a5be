"""Which tensors exist, who owns them, and which optimizer groups hold them.

Identity is the only key: tied weights are one tensor with aliases, and optimizer membership is
`is`, never a name or a value (a name filter is exactly the bug we are looking for).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from ...core.schema import FSDP1_SLICE
from ..engines.refused import refuse_engines, refuse_flat_buffers
from ..engines.fsdp1 import clean_name, slices
from ..engines.shards import placement
from .unregistered import find_paths
from ..engines.zero import whole_numel, whole_shape


@dataclasses.dataclass
class Inventory:
    """The unique tensors under observation, in table order, and their static facts."""

    tensors: list[torch.Tensor]
    rows: list[dict]
    # (optimizer, group) of each tensor's first membership, or None: where its lr is read.
    first_group: list[tuple[int, int] | None]
    # The model the tensors come from: where `diagkit.measure.model.unregistered` names what it finds.
    model: torch.nn.Module | None = None
    # k -> `measure.engines.fsdp1.Slice` of each FSDP1 original tensor (use_orig_params=True).
    slices: dict = dataclasses.field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [row["name"] for row in self.rows]

    def held_by(self, n_optimizers: int) -> list[np.ndarray]:
        """Per optimizer, the indices of the tensors it holds (in any of its groups)."""
        return [np.array([k for k, row in enumerate(self.rows)
                          if any(o == i for o, _ in row["memberships"])], dtype=np.int64)
                for i in range(n_optimizers)]

    def lr_slots(self) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The (optimizer, group) pairs whose lr is read, and each tensor's index among them
        (-1: held by no optimizer)."""
        slots = sorted({g for g in self.first_group if g is not None})
        return slots, np.array([-1 if g is None else slots.index(g) for g in self.first_group],
                               dtype=np.int64)


def take_inventory(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer],
                   former: dict[int, str] | None = None) -> Inventory:
    """The tensors of `model` and `optimizers`, by identity; an engine whose tensors are not
    the model's is refused in one line (`measure.engines.refused`), never judged. `former`: names by
    `id()` for tensors an optimizer holds and the model no longer does (a whole run's head
    replaced mid-run: `<head.weight, replaced at step 150>`), used where no attribute path
    names them (`_name_by_path`); the caller holds those tensors, so their ids are theirs."""
    fsdp1 = slices(model)
    refuse_engines(model, optimizers, fsdp1)
    tensors: list[torch.Tensor] = []
    rows: list[dict] = []
    index: dict[int, int] = {}

    modules = dict(model.named_modules(remove_duplicate=False))
    for name, tensor in model.named_parameters(remove_duplicate=False):
        key = id(tensor)
        if key in index:
            rows[index[key]]["aliases"] += (clean_name(name),)
            continue
        index[key] = len(tensors)
        tensors.append(tensor)
        module = name.rpartition(".")[0]
        rows.append(_row(clean_name(name), tensor, clean_name(module),
                         type(modules[module]).__name__, in_model=True, fsdp1=fsdp1))

    memberships: dict[int, list[tuple[int, int]]] = {}
    for i, opt in enumerate(optimizers):
        for j, group in enumerate(opt.param_groups):
            for k, tensor in enumerate(group["params"]):
                key = id(tensor)
                if key not in index:  # held by an optimizer, not by the model
                    index[key] = len(tensors)
                    tensors.append(tensor)
                    rows.append(_row(f"<optimizer {i} group {j} #{k}>", tensor, "", "",
                                     in_model=False))
                pairs = memberships.setdefault(key, [])
                if (i, j) not in pairs:
                    pairs.append((i, j))

    _name_by_path(model, tensors, rows, former or {})
    first_group = []
    for tensor, row in zip(tensors, rows):
        pairs = tuple(memberships.get(id(tensor), ()))
        row["memberships"] = pairs
        row["n_optimizers"] = len({i for i, _ in pairs})
        row["optimizer"], row["group"] = pairs[0] if pairs else (None, None)
        first_group.append(pairs[0] if pairs else None)
        row["lr"], row["weight_decay"] = _hyper(optimizers, pairs)
    refuse_flat_buffers(tensors, rows)
    return Inventory(tensors=tensors, rows=rows, first_group=first_group, model=model,
                     slices={k: fsdp1[id(t)] for k, t in enumerate(tensors) if id(t) in fsdp1})


def _name_by_path(model, tensors: list, rows: list[dict], former: dict[int, str]) -> None:
    """A tensor an optimizer holds but the model does not is named, as an unregistered one
    is (`measure.model.unregistered.find_paths`), by where it lives among the model's plain
    attributes (`layers[0].weight`: a module kept in a plain list), with that module as its
    own; else by what it was (`former`); one the model cannot reach and that was never its
    (a forward argument) keeps `<optimizer i group j #k>`."""
    outside = [k for k, row in enumerate(rows) if not row["in_model"]]
    paths = find_paths(model, {id(tensors[k]) for k in outside}) if outside else {}
    for k in outside:
        found = paths.get(id(tensors[k]))
        if found is not None:
            rows[k].update(name=found[0], module=found[1], module_type=found[2])
        elif id(tensors[k]) in former:
            rows[k]["name"] = former[id(tensors[k])]


def _row(name, tensor, module, module_type, in_model, fsdp1=None):
    """A tensor's static facts; a ZeRO-3 parameter's or an FSDP1 slice's shape is the whole
    one (`measure.engines.zero`, `measure.engines.fsdp1`)."""
    sliced = (fsdp1 or {}).get(id(tensor))
    shape = sliced.shape if sliced is not None else whole_shape(tensor)
    numel = math.prod(shape) if sliced is not None else whole_numel(tensor)
    return {
        "name": name,
        "aliases": (),
        "module": module,
        "module_type": module_type,
        "shape": shape,
        "numel": numel,
        "bytes": numel * tensor.element_size(),
        "dtype": str(tensor.dtype),
        "device": str(tensor.device),
        "placement": FSDP1_SLICE if sliced is not None else placement(tensor),
        "stage": "",
        "in_model": in_model,
        "requires_grad": tensor.requires_grad,
    }


def _hyper(optimizers, pairs):
    """lr and weight decay of the tensor's own (first) group, the one `optimizer`/`group`
    name: another optimizer's group never lends it its decay."""
    if not pairs:
        return float("nan"), float("nan")
    i, j = pairs[0]
    group = optimizers[i].param_groups[j]
    return group_lr(group), float(group.get("weight_decay", 0.0) or 0.0)


def group_lr(group: dict) -> float:
    lr = group.get("lr", float("nan"))
    return float(lr.item() if isinstance(lr, torch.Tensor) else lr)
