"""Loading a checkpoint (of any kind: `checkpoint_kind`) into the model by name (the `module.`
prefix tolerated on either side), and its optimizer state into a matching optimizer; a
`LoadReport` says what happened."""

from __future__ import annotations

import math

import torch

from ...core.errors import DiagkitError
from ...core.format import brief
from ...core.result import LoadReport
from .kind import open_checkpoint
from .read import align_prefix
from .stream import itemsize


def load_checkpoint(model: torch.nn.Module, path, trust: bool = False,
                    optimizers: list | None = None) -> LoadReport:
    """Load by name, tolerating the `module.` wrapper prefix on either side; report everything.

    `path` is any checkpoint `checkpoint_kind` knows: a file, a Hugging Face sharded
    checkpoint, a torch.distributed.checkpoint folder. The report is decided from the names,
    shapes and dtypes alone, before any tensor is read; the tensors are then loaded a piece at
    a time (a file whole, a shard, a bounded group), so the report is the same for the same
    tensors in any form. Tensors whose shape differs are not loaded (and reported); loading
    nothing that matches is an error. An optimizer state dict in the checkpoint is mapped onto
    the current optimizer when its groups have the same sizes.
    """
    source = open_checkpoint(path, trust)
    try:
        report, keys = _plan(model, source, path)
        _load_pieces(model, source, keys)
        opt_state = source.optimizer_state() if optimizers else None
        if opt_state is not None:
            report.optimizer = _load_optimizer_state(model, optimizers, opt_state)
    finally:
        source.close()
    return report


def _plan(model, source, path) -> tuple[LoadReport, dict[str, str]]:
    """The load report from the checkpoint's metadata, and the file key of each tensor to load
    (by the model's name)."""
    metas = {k: source.meta(k) for k in source.keys()}
    own = model.state_dict()
    key_of = align_prefix({k: k for k in metas}, set(own))  # the model's name -> file key
    shape = {n: tuple(metas[k][0]) for n, k in key_of.items()}
    dtype = {n: metas[k][1] for n, k in key_of.items()}
    names = set(key_of) & set(own)
    mismatched = [{"name": n, "file": shape[n], "model": tuple(own[n].shape)}
                  for n in sorted(names) if shape[n] != tuple(own[n].shape)]
    matched = sorted(n for n in names if shape[n] == tuple(own[n].shape))
    if not matched:
        hint = (f"e.g. file has {next(iter(key_of))!r}, model has {next(iter(sorted(own)), '')!r}"
                if not names else f"{len(mismatched)} names match but every shape differs")
        raise DiagkitError(f"checkpoint {path} matches none of the model's {len(own)} tensor "
                           f"names ({hint}): is it for another architecture?")
    dtype_cast = [{"name": n, "file": str(dtype[n]), "model": str(own[n].dtype)}
                  for n in matched if dtype[n] != own[n].dtype]
    report = LoadReport(
        path=str(path), matched=matched, missing=sorted(set(own) - set(key_of)),
        unexpected=sorted(set(key_of) - set(own)), mismatched=mismatched, dtype_cast=dtype_cast,
        file_bytes={n: math.prod(shape[n]) * itemsize(dtype[n]) for n in key_of})
    return report, {key_of[n]: n for n in matched}


def _load_pieces(model, source, keys: dict[str, str]) -> None:
    """Copy each piece's matched tensors into the model, dropping the piece before the next
    is read (so at most one piece is held)."""
    for piece in source.pieces():
        model.load_state_dict({keys[k]: t for k, t in piece.items() if k in keys}, strict=False)
        del piece


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
