"""Reading checkpoint files: a PyTorch file with weights_only=True (memory-mapped where it can
be), or a `.safetensors` file; the state dict inside it, and an optimizer state beside it.
Bad files end in a one-line `DiagkitError`, never a traceback from the unpickler."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from ...core.errors import DiagkitError
from ...core.format import brief

_NESTED_KEYS = ("model", "state_dict", "model_state_dict", "module", "net")


_OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optim", "opt")


TRUST_FLAG = "--trust-checkpoint"


# What torch's weights-only unpickler says when a file names a class or function to run
# (its wording changes between versions: 2.13 says "unsupported GLOBAL posix.system whose
# module posix is blocked" for an `os.system` payload).
_NEEDS_CODE = re.compile(r"unsupported global|not an allowed global|global \S+ is not allowed"
                         r"|whose module \S+ is blocked", re.I)
# The advice torch puts before its reason (load with weights_only=False): not for a bad file.
_TORCH_ADVICE = re.compile(r"^Weights only load failed\..*?(?:trusted source\.|$)", re.S)


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
            return _torch_load(file, trust)
    except pickle.UnpicklingError as exc:
        raise unpickling_error(path, str(exc)) from None
    except Exception as exc:  # truncated zip, not a checkpoint at all, ...
        raise DiagkitError(f"checkpoint {path} is not a readable PyTorch file: "
                           f"{type(exc).__name__}: {brief(exc)}") from None


def _torch_load(file: Path, trust: bool):
    """torch.load, memory-mapped where the format allows."""
    with openable_name(file) as name:
        try:
            return torch.load(name, map_location="cpu", weights_only=not trust, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(name, map_location="cpu", weights_only=not trust)


@contextlib.contextmanager
def openable_name(path):
    """A name of the file `path` that torch's and safetensors' readers can open. They take
    UTF-8 names only, and a name saved under another locale reaches Python with its bytes kept
    as surrogates ("surrogates not allowed", "not valid UTF-8": a good file called unreadable).
    Such a file is opened here and named by its descriptor, /proc/self/fd/N (Linux), for as
    long as the reader opens it; where there is no /proc, one line asks for a UTF-8 name."""
    name = str(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        yield name
        return
    if not os.path.isdir("/proc/self/fd"):
        raise DiagkitError(f"checkpoint {path}: its file name is not UTF-8, which the "
                           "checkpoint readers cannot open; rename it")
    fd = os.open(path, os.O_RDONLY)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def unpickling_error(path, text: str) -> DiagkitError:
    """Two different problems, two different lines: a file that names code to run (refused,
    `--trust-checkpoint` runs it) and a file that is damaged or not a checkpoint at all (no
    flag helps: telling the user to trust it would be wrong)."""
    if _NEEDS_CODE.search(text):
        return DiagkitError(f"checkpoint {path} needs arbitrary unpickling (it can run code) "
                            f"and was refused; if you trust its source, pass {TRUST_FLAG}")
    detail = re.search(r"WeightsUnpickler error:\s*(.*?)\s*(?:Check the documentation|$)",
                       text, re.S)
    reason = detail.group(1) if detail else _TORCH_ADVICE.sub("", text).split(
        "Check the documentation")[0]
    return DiagkitError(f"checkpoint {path} is not a readable PyTorch file (not a checkpoint, "
                        f"or damaged): {brief(reason.strip() or text)}")


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
        with openable_name(file) as name:
            return load_file(name, device="cpu")
    except DiagkitError:
        raise
    except Exception as exc:
        raise DiagkitError(f"checkpoint {file} is not a readable safetensors file: "
                           f"{type(exc).__name__}: {brief(exc)}") from None


_MAX_NESTING = 16  # real files nest a state dict 1-3 levels deep; a hostile one 1000


def find_state_dict(obj, path="checkpoint") -> dict[str, torch.Tensor]:
    """The mapping of tensors in `obj`, at its top level or nested under `_NESTED_KEYS`.
    Followed in a loop, at most `_MAX_NESTING` levels, so a file nested a thousand levels deep
    is one clear line, not a RecursionError."""
    for _level in range(_MAX_NESTING + 1):
        if isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor)
                                                    for v in obj.values()):
            return dict(obj)
        key = next((k for k in _NESTED_KEYS if isinstance(obj, Mapping) and k in obj), None)
        if key is None:
            raise DiagkitError(f"{path} holds no state dict of tensors (looked at the top level "
                               f"and under {', '.join(_NESTED_KEYS)})")
        obj = obj[key]
    raise DiagkitError(f"{path} nests its entries more than {_MAX_NESTING} levels deep (under "
                       f"{', '.join(_NESTED_KEYS)}) without reaching a state dict of tensors: "
                       "not a checkpoint diagkit can read")


def optimizer_key(obj):
    """The key an optimizer state dict is stored under beside the weights, or None."""
    if not isinstance(obj, Mapping):
        return None
    for key in _OPTIMIZER_KEYS:
        value = obj.get(key)
        if isinstance(value, Mapping) and "state" in value and "param_groups" in value:
            return key
    return None


def find_optimizer_state(obj) -> dict | None:
    """An optimizer state dict stored beside the weights, if the file has one."""
    key = optimizer_key(obj)
    return None if key is None else dict(obj[key])


def align_prefix(state: dict, wanted: set) -> dict:
    if set(state) & wanted:
        return state
    stripped = {k.removeprefix("module."): v for k, v in state.items()}
    if set(stripped) & wanted:
        return stripped
    added = {f"module.{k}": v for k, v in state.items()}
    return added if set(added) & wanted else state
