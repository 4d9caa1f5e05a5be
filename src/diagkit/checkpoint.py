"""Load a checkpoint into the model under diagnosis, safely (`weights_only=True`)."""

from __future__ import annotations

import dataclasses
import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch

from .errors import DiagkitError
from .findings import Finding, human_bytes

NESTED_KEYS = ("model", "state_dict", "model_state_dict", "module", "net")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optim", "opt")
TRUST_FLAG = "--trust-checkpoint"
# What torch's weights-only unpickler says when a file names a class or function to run.
_NEEDS_CODE = re.compile(r"Unsupported global|not an allowed global|global .* is not allowed")


def read_checkpoint(path, trust: bool = False):
    """The file's object: a safetensors dict, or a PyTorch file read with weights_only=True
    (memory-mapped where the format allows, so a large file is not read whole)."""
    file = Path(path)
    if not file.is_file():
        raise DiagkitError(f"no such checkpoint file: {path}")
    if file.stat().st_size == 0:
        raise DiagkitError(f"checkpoint {path} is empty")
    if file.suffix == ".safetensors":
        return _read_safetensors(file)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's news
            warnings.simplefilter("ignore")
            try:
                return torch.load(file, map_location="cpu", weights_only=not trust, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                return torch.load(file, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as exc:
        if _NEEDS_CODE.search(str(exc)):
            raise DiagkitError(f"checkpoint {path} needs arbitrary unpickling (it can run code) "
                               f"and was refused; if you trust its source, pass {TRUST_FLAG}"
                               ) from None
        # torch's text starts with advice to load with weights_only=False: not for a bad file
        detail = re.search(r"WeightsUnpickler error:\s*(.*?)\s*(?:Check the documentation|$)",
                           str(exc), re.S)
        raise DiagkitError(f"checkpoint {path} is not a readable PyTorch file (not a checkpoint, "
                           f"or damaged): {brief(detail.group(1)) if detail else brief(exc)}"
                           ) from None
    except Exception as exc:  # truncated zip, not a checkpoint at all, ...
        raise DiagkitError(f"checkpoint {path} is not a readable PyTorch file: "
                           f"{type(exc).__name__}: {brief(exc)}") from None


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
        return load_file(str(file), device="cpu")
    except Exception as exc:
        raise DiagkitError(f"checkpoint {file} is not a readable safetensors file: "
                           f"{type(exc).__name__}: {brief(exc)}") from None


def brief(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


def find_state_dict(obj, path="checkpoint") -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    if isinstance(obj, Mapping):
        for key in NESTED_KEYS:
            if key in obj:
                return find_state_dict(obj[key], path)
    raise DiagkitError(f"{path} holds no state dict of tensors (looked at the top level and "
                       f"under {', '.join(NESTED_KEYS)})")


def find_optimizer_state(obj) -> dict | None:
    """An optimizer state dict stored beside the weights, if the file has one."""
    if not isinstance(obj, Mapping):
        return None
    for key in OPTIMIZER_KEYS:
        value = obj.get(key)
        if isinstance(value, Mapping) and "state" in value and "param_groups" in value:
            return dict(value)
    return None


@dataclasses.dataclass
class LoadReport:
    """What loading a checkpoint into the model did, tensor by tensor."""

    path: str
    matched: list[str]
    missing: list[str]  # in the model, not in the file
    unexpected: list[str]  # in the file, not in the model
    mismatched: list[dict]  # same name, different shape (not loaded)
    dtype_cast: list[dict]  # same name and shape, different dtype (loaded, cast)
    file_bytes: dict[str, int]  # bytes of every tensor in the file, by model name
    optimizer: dict | None = None

    def table(self) -> pd.DataFrame:
        rows = [{"name": n, "status": "loaded"} for n in self.matched]
        rows += [{"name": n, "status": "missing from the file"} for n in self.missing]
        rows += [{"name": n, "status": "not in the model"} for n in self.unexpected]
        rows += [{"name": m["name"], "status": "shape mismatch (not loaded)",
                  "file": str(m["file"]), "model": str(m["model"])} for m in self.mismatched]
        rows += [{"name": m["name"], "status": "dtype cast", "file": m["file"],
                  "model": m["model"]} for m in self.dtype_cast]
        return pd.DataFrame(rows, columns=["name", "status", "file", "model"])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        size = human_bytes(sum(self.file_bytes.get(n, 0) for n in self.matched))
        parts = [f"{len(self.matched)} tensors loaded ({size})"]
        for label, items in (("missing from the file", self.missing),
                             ("in the file but not the model", self.unexpected),
                             ("with another shape", self.mismatched),
                             ("cast to the model's dtype", self.dtype_cast)):
            if items:
                parts.append(f"{len(items)} {label}")
        opt = self.optimizer
        if opt is not None:
            parts.append("optimizer state " + (f"loaded ({len(opt['with_state'])} tensors with "
                                               f"state, {len(opt['without_state'])} without)"
                                               if opt["loaded"] else f"not loaded: {opt['why']}"))
        return f"checkpoint {self.path}: " + ", ".join(parts)


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


def align_prefix(state: dict, wanted: set) -> dict:
    if set(state) & wanted:
        return state
    stripped = {k.removeprefix("module."): v for k, v in state.items()}
    if set(stripped) & wanted:
        return stripped
    added = {f"module.{k}": v for k, v in state.items()}
    return added if set(added) & wanted else state


# ------------------------------------------------------------------ judging what was loaded
def load_findings(report: LoadReport) -> list[Finding]:
    """The load report as findings: what did not load is worth a look before trusting a run."""
    found = []
    if report.mismatched:
        names = tuple(m["name"] for m in report.mismatched)
        found.append(Finding(
            "checkpoint_shape_mismatch", "error", names,
            f"{len(names)} tensor(s) in {report.path} have another shape than the model's and "
            f"were not loaded (e.g. `{names[0]}`: file {report.mismatched[0]['file']}, model "
            f"{report.mismatched[0]['model']}).",
            "Build the model with the configuration the checkpoint was saved with.",
            module="", count=len(names), bytes=0))
    if report.missing:
        # Whole modules absent from the file are new parts (a finetune head): expected.
        loaded_tops = {n.split(".")[0] for n in report.matched} | {
            m["name"].split(".")[0] for m in report.mismatched}
        partial = [n for n in report.missing if n.split(".")[0] in loaded_tops]
        found.append(Finding(
            "checkpoint_missing", "warning" if partial else "info", tuple(report.missing),
            f"{len(report.missing)} tensor(s) of the model are not in {report.path} and keep "
            f"their fresh initialisation (e.g. `{(partial or report.missing)[0]}`)"
            + ("; they sit in modules the file otherwise covers." if partial
               else ", all in modules the file does not cover: new parts, as in a finetune."),
            "Expected for a new head; otherwise check the layout or the `module.` prefix.",
            module="", count=len(report.missing), bytes=0))
    if report.unexpected:
        size = sum(report.file_bytes.get(n, 0) for n in report.unexpected)
        found.append(Finding(
            "checkpoint_unexpected", "info", tuple(report.unexpected),
            f"{len(report.unexpected)} tensor(s) in {report.path} have no place in the model "
            f"({human_bytes(size)}; e.g. `{report.unexpected[0]}`).",
            "Drop them from the checkpoint if they are stale.",
            module="", count=len(report.unexpected), bytes=size))
    opt = report.optimizer
    if opt is not None and not opt["loaded"]:
        found.append(Finding(
            "checkpoint_optimizer_mismatch", "warning", (),
            f"the optimizer state in {report.path} does not fit the current optimizer: "
            f"{opt['why']}.",
            "Build the optimizer's param groups the way they were when the checkpoint was saved.",
            module="", count=0, bytes=0))
    return found


AUDITED = {"unused": "unused", "orphan": "orphan", "frozen": "frozen"}


def audit(params: pd.DataFrame, report: LoadReport) -> dict:
    """Bytes the checkpoint spends on tensors the diagnosis found dead: unused (never get a
    gradient), orphan (never trained) or frozen (requires_grad False)."""
    file_bytes = report.file_bytes
    rows = {}
    for name, verdicts, rg in zip(params["name"], params["verdicts"], params["requires_grad"]):
        kind = ("orphan" if "orphan" in verdicts else "unused" if "unused" in verdicts
                else "frozen" if not rg else None)
        if kind and name in file_bytes:
            rows.setdefault(kind, []).append(name)
    total = sum(file_bytes.values())
    out = {"checkpoint_bytes": total, "by_kind": {}}
    for kind, names in rows.items():
        size = sum(file_bytes[n] for n in names)
        out["by_kind"][kind] = {"tensors": len(names), "bytes": size,
                                "share": size / total if total else 0.0, "names": names}
    return out


def audit_finding(result: dict, path: str) -> Finding | None:
    dead = {k: v for k, v in result["by_kind"].items() if k in ("unused", "orphan")}
    if not dead:
        return None
    size = sum(v["bytes"] for v in dead.values())
    names = tuple(n for v in dead.values() for n in v["names"])
    share = size / result["checkpoint_bytes"] if result["checkpoint_bytes"] else 0.0
    detail = ", ".join(f"{v['tensors']} {k} ({human_bytes(v['bytes'])})" for k, v in dead.items())
    return Finding(
        "dead_weight_in_checkpoint", "info", names,
        f"{human_bytes(size)} of {path} ({share:.0%}) belong to tensors this run never trains: "
        f"{detail}. Every checkpoint saved from this model carries them.",
        "Drop or freeze those tensors before training (see the unused/orphan findings); "
        "saved checkpoints then shrink by that much.",
        module="", count=len(names), bytes=size)
