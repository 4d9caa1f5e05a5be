"""Load a checkpoint into the model under diagnosis, safely (`weights_only=True`)."""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from .errors import DiagkitError

NESTED_KEYS = ("model", "state_dict", "model_state_dict", "module", "net")
TRUST_FLAG = "--trust-checkpoint"
# What torch's weights-only unpickler says when a file names a class or function to run.
_NEEDS_CODE = re.compile(r"Unsupported global|not an allowed global|global .* is not allowed")


def read_checkpoint(path, trust: bool = False):
    file = Path(path)
    if not file.is_file():
        raise DiagkitError(f"no such checkpoint file: {path}")
    if file.stat().st_size == 0:
        raise DiagkitError(f"checkpoint {path} is empty")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's news
            warnings.simplefilter("ignore")
            return torch.load(file, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as exc:
        if _NEEDS_CODE.search(str(exc)):
            raise DiagkitError(f"checkpoint {path} needs arbitrary unpickling (it can run code) "
                               f"and was refused; if you trust its source, pass {TRUST_FLAG}"
                               ) from None
        raise DiagkitError(f"checkpoint {path} is not a readable PyTorch file: {exc}") from None
    except Exception as exc:  # truncated zip, not a checkpoint at all, ...
        reason = " ".join(str(exc).split())[:200]
        raise DiagkitError(f"checkpoint {path} is not a readable PyTorch file: "
                           f"{type(exc).__name__}: {reason}") from None


def find_state_dict(obj, path="checkpoint") -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    if isinstance(obj, Mapping):
        for key in NESTED_KEYS:
            if key in obj:
                return find_state_dict(obj[key], path)
    raise DiagkitError(f"{path} holds no state dict of tensors (looked at the top level and "
                       f"under {', '.join(NESTED_KEYS)})")


def load_checkpoint(model: torch.nn.Module, path, trust: bool = False) -> dict:
    """Load by name, tolerating the `module.` wrapper prefix on either side."""
    state = find_state_dict(read_checkpoint(path, trust), str(path))
    wanted = set(model.state_dict())
    state = _align_prefix(state, wanted)
    matched = sorted(set(state) & wanted)
    if not matched:
        raise DiagkitError(f"checkpoint {path} matches none of the model's "
                           f"{len(wanted)} tensor names (e.g. file has {next(iter(state))!r}, "
                           f"model has {next(iter(sorted(wanted)), '')!r})")
    try:
        result = model.load_state_dict({k: state[k] for k in matched}, strict=False)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:300]
        raise DiagkitError(f"checkpoint {path} does not fit the model: {detail}") from None
    return {"matched": matched, "missing": sorted(result.missing_keys),
            "unexpected": sorted(set(state) - wanted)}


def _align_prefix(state: dict, wanted: set) -> dict:
    if set(state) & wanted:
        return state
    stripped = {k.removeprefix("module."): v for k, v in state.items()}
    if set(stripped) & wanted:
        return stripped
    added = {f"module.{k}": v for k, v in state.items()}
    return added if set(added) & wanted else state
