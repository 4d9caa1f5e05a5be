"""The `.metadata` file of a `torch.distributed.checkpoint` folder, read without running code.

torch reads it with a plain `pickle.load`, which runs whatever the file names; diagkit's promise
is weights-only loading unless `--trust-checkpoint`. So it is unpickled here with an allowlist:
the metadata classes of `torch.distributed.checkpoint`, torch's dtypes, `torch.Size`, layouts
and paths. Anything else is refused with the line that names the flag. The data files it
points to are checked to exist and be long enough, so a missing or truncated `__N_M.distcp` is
one line naming it before anything loads.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pickle
from pathlib import Path

import torch

from ...core.errors import DiagkitError
from ...core.format import brief
from .read import TRUST_FLAG

_DCP = "torch.distributed.checkpoint."
_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"),
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("collections", "OrderedDict"), ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
            ("pathlib", "PureWindowsPath")}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only what a DCP metadata file holds (dataclasses and enums of the checkpoint
    package, dtypes, sizes, layouts, paths)."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype,
                                                                          torch.layout)):
            return getattr(torch, name)
        if module.startswith(_DCP) and module.rsplit(".", 1)[-1] in ("metadata", "planner"):
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type) and (dataclasses.is_dataclass(found)
                                            or issubclass(found, enum.Enum)):
                return found
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")


def read_metadata(folder: Path, trust: bool):
    """The folder's `Metadata`, unpickled with the allowlist (plain pickle when `trust`)."""
    from torch.distributed.checkpoint.metadata import Metadata
    path = folder / ".metadata"
    if path.stat().st_size == 0:
        raise DiagkitError(f"checkpoint metadata {path} is empty")
    try:
        with open(path, "rb") as fh:
            meta = pickle.load(fh) if trust else _MetadataUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        if "is not allowed" in str(exc):
            raise DiagkitError(f"checkpoint metadata {path} needs arbitrary unpickling (it can "
                               f"run code: {brief(exc)}) and was refused; if you trust its "
                               f"source, pass {TRUST_FLAG}") from None
        raise _damaged(path, exc) from None
    except Exception as exc:  # truncated, not a pickle at all, ...
        raise _damaged(path, exc) from None
    if not isinstance(meta, Metadata) or not isinstance(meta.storage_data, dict):
        raise DiagkitError(f"checkpoint metadata {path} is not torch.distributed.checkpoint "
                           f"metadata (it holds a {type(meta).__name__})")
    check_data_files(folder, meta)
    return meta


def _damaged(path: Path, exc: Exception) -> DiagkitError:
    return DiagkitError(f"checkpoint metadata {path} is damaged or not torch.distributed."
                        f"checkpoint metadata: {type(exc).__name__}: {brief(exc)}")


def check_data_files(folder: Path, meta) -> None:
    """Every data file the metadata points into exists and reaches the last byte it names."""
    needed: dict[str, int] = {}
    for info in meta.storage_data.values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in needed.items():
        path = folder / name
        if not path.is_file():
            raise DiagkitError(f"data file {path} of checkpoint {folder} is missing")
        size = path.stat().st_size
        if size < end:
            raise DiagkitError(f"data file {path} of checkpoint {folder} is truncated "
                               f"({size} bytes, the metadata reads up to byte {end})")
