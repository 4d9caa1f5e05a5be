"""Loading a checkpoint into the model by name (the `module.` prefix tolerated on either
side), and its optimizer state into a matching optimizer; a `LoadReport` says what happened."""

from __future__ import annotations

import torch

from ..core.errors import DiagkitError
from ..core.format import brief
from ..core.result import LoadReport
from .checkpoint_read import align_prefix, find_optimizer_state, find_state_dict, read_checkpoint


def load_checkpoint(model: torch.nn.Module, path, trust: bool = False,
                    optimizers: list | None = None) -> LoadReport:
    """Load by name, tolerating the `module.` wrapper prefix on either side; report everything.

    Tensors whose shape differs are not loaded (and reported); loading nothing that matches is
    an error. An optimizer state dict in the file is mapped onto the current optimizer when its
    groups have the same sizes.
    """
    obj = read_checkpoint(path, trust)
    state = find_state_dict(obj, str(path))
    own = model.state_dict()
    state = align_prefix(state, set(own))
    names = set(state) & set(own)
    mismatched = [{"name": n, "file": tuple(state[n].shape), "model": tuple(own[n].shape)}
                  for n in sorted(names) if state[n].shape != own[n].shape]
    matched = sorted(n for n in names if state[n].shape == own[n].shape)
    if not matched:
        hint = (f"e.g. file has {next(iter(state))!r}, model has {next(iter(sorted(own)), '')!r}"
                if not names else f"{len(mismatched)} names match but every shape differs")
        raise DiagkitError(f"checkpoint {path} matches none of the model's {len(own)} tensor "
                           f"names ({hint}): is it for another architecture?")
    dtype_cast = [{"name": n, "file": str(state[n].dtype), "model": str(own[n].dtype)}
                  for n in matched if state[n].dtype != own[n].dtype]
    model.load_state_dict({n: state[n] for n in matched}, strict=False)
    report = LoadReport(
        path=str(path), matched=matched, missing=sorted(set(own) - set(state)),
        unexpected=sorted(set(state) - set(own)), mismatched=mismatched, dtype_cast=dtype_cast,
        file_bytes={n: t.numel() * t.element_size() for n, t in state.items()})
    opt_state = find_optimizer_state(obj)
    if opt_state is not None and optimizers:
        report.optimizer = _load_optimizer_state(model, optimizers, opt_state)
    return report


def _load_optimizer_state(model, optimizers, saved: dict) -> dict:
    names = {id(p): n for n, p in model.named_parameters()}
    file_sizes = [len(g["params"]) for g in saved["param_groups"]]
    base = {"groups_in_file": len(file_sizes), "sizes_in_file": file_sizes,
            "with_state": [], "without_state": [], "loaded": False, "why": ""}
    for i, opt in enumerate(optimizers):
        sizes = [len(g["params"]) for g in opt.param_groups]
        if sizes != file_sizes:
            continue
        try:
            opt.load_state_dict(saved)
        except (ValueError, RuntimeError, KeyError) as exc:
            return {**base, "optimizer": i, "why": brief(exc)}
        tensors = [p for g in opt.param_groups for p in g["params"]]
        with_state = [names.get(id(p), f"<optimizer {i} #{k}>") for k, p in enumerate(tensors)
                      if opt.state.get(p)]
        without = [names.get(id(p), f"<optimizer {i} #{k}>") for k, p in enumerate(tensors)
                   if not opt.state.get(p)]
        return {**base, "optimizer": i, "loaded": True, "with_state": with_state,
                "without_state": without}
    current = [[len(g["params"]) for g in o.param_groups] for o in optimizers]
    return {**base, "why": f"the file's groups have sizes {file_sizes}, the optimizers' "
                           f"{current}"}
