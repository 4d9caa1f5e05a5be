"""A `torch.distributed.checkpoint` (DCP) folder: a `.metadata` file and the `__N_M.distcp`
files `torch.distributed.checkpoint.save` wrote, read in one process, without a process group
(`torch.distributed.checkpoint.load(..., no_dist=True)`), whatever world size saved it.

Names, shapes and dtypes come from the metadata (`checkpoint_dcp_meta`, read without running
code). The saved object's nesting is rebuilt from the metadata's `planner_data`, so the state
dict and an optimizer state beside it are found as in one file (`checkpoint_read`): under
`model`, `state_dict`, ... and `optimizer`, ...; other entries (a step count) are ignored.
An optimizer state with no per-parameter state (SGD without momentum: DCP drops the empty
`state`) is found as in one file. Every pickled entry, used or not, is read weights-only when
the folder is opened, as one file is unpickled whole: one that needs code is refused in one
line naming it, never skipped.

Memory bound: loading into a model reads the state dict in pieces of at most `PIECE_BYTES`
(a larger tensor is a piece alone); DCP reads one tensor's bytes at a time into a piece, so
peak memory is about max(`PIECE_BYTES`, largest tensor) + the largest tensor. Comparing holds
one whole tensor per side at a time. An optimizer state is read whole (the optimizer's
`load_state_dict` needs it all at once), and only when there is an optimizer to load it into.
"""

from __future__ import annotations

import math
import pickle
import warnings
from pathlib import Path

import torch

from ...core.errors import DiagkitError
from ...core.format import brief
from .dcp_meta import read_metadata
from .read import find_state_dict, optimizer_key, unpickling_error

PIECE_BYTES = 64 << 20  # bytes of tensors one load call allocates and fills


class _Bytes:
    """A non-tensor entry of the checkpoint (a pickled Python object), not yet read."""

    def __init__(self, fqn: str):
        self.fqn = fqn


def _skeleton(meta) -> tuple[dict, dict[int, str]]:
    """The saved object's nesting, with a meta-device tensor (no memory) for every tensor and
    a `_Bytes` for every other entry; and the flat DCP key of each tensor leaf, by id."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    paths = meta.planner_data if isinstance(meta.planner_data, dict) else {}
    root: dict = {}
    fqn_of: dict[int, str] = {}
    for fqn, md in meta.state_dict_metadata.items():
        path = tuple(paths.get(fqn) or (fqn,))
        node = root
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise DiagkitError(f"checkpoint metadata names {fqn!r} inside a non-mapping")
        if isinstance(md, TensorStorageMetadata):
            leaf = torch.empty(tuple(md.size), dtype=md.properties.dtype, device="meta")
            fqn_of[id(leaf)] = fqn
        else:
            leaf = _Bytes(fqn)
        node[path[-1]] = leaf
    for value in root.values():  # DCP keeps no empty mapping: an SGD's `state` was {}
        if isinstance(value, dict) and "param_groups" in value:
            value.setdefault("state", {})
    return root, fqn_of


class DcpCheckpoint:
    """A DCP folder with the interface of one file (`checkpoint_stream`): keys, meta, rows and
    pages for comparing, pieces and optimizer_state for loading."""

    def __init__(self, folder: Path, trust: bool):
        self.folder, self.trust = Path(folder), trust
        self.metadata = read_metadata(self.folder, trust)
        self.skeleton, fqn_of = _skeleton(self.metadata)
        if not trust:
            self._check_pickled()
        state = find_state_dict(self.skeleton, str(self.folder))
        self.fqn = {name: fqn_of[id(t)] for name, t in state.items()}
        self.metas = {name: (tuple(t.shape), t.dtype) for name, t in state.items()}
        self._cached: tuple[str, torch.Tensor] | None = None
        self.pages = _NoPages()

    def keys(self) -> list[str]:
        return list(self.fqn)

    def meta(self, key: str):
        return self.metas[key]

    def load_piece(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """The tensors `keys`, read from the folder: the only place its tensors are read."""
        flat = {self.fqn[k]: torch.empty(self.metas[k][0], dtype=self.metas[k][1])
                for k in keys}
        self._load(flat)
        return {k: flat[self.fqn[k]] for k in keys}

    def pieces(self):
        """The state dict in pieces of at most `PIECE_BYTES` (a larger tensor alone)."""
        group, size = [], 0
        for key, (shape, dtype) in self.metas.items():
            nbytes = math.prod(shape) * dtype.itemsize
            if group and size + nbytes > PIECE_BYTES:
                yield self.load_piece(group)
                group, size = [], 0
            group.append(key)
            size += nbytes
        if group:
            yield self.load_piece(group)

    def rows(self, key: str, start: int | None, stop: int | None) -> torch.Tensor:
        if self._cached is None or self._cached[0] != key:
            self._cached = None  # the previous tensor goes before the next is read
            self._cached = (key, self.load_piece([key])[key])
        t = self._cached[1]
        return (t if start is None else t[start:stop]).reshape(-1)

    def optimizer_state(self) -> dict | None:
        """The optimizer state saved beside the weights, read whole, rebuilt as torch's
        `Optimizer.state_dict()` has it (lists, integer parameter ids)."""
        key = optimizer_key(self.skeleton)
        if key is None:
            return None
        paths = self.metadata.planner_data if isinstance(self.metadata.planner_data,
                                                         dict) else {}
        leaves = {}
        for fqn in self.metadata.state_dict_metadata:
            path = tuple(paths.get(fqn) or (fqn,))
            if len(path) > 1 and path[0] == key:
                leaves[fqn] = path[1:]
        flat = {fqn: _allocate(self.metadata.state_dict_metadata[fqn]) for fqn in leaves}
        self._load(flat)
        nested: dict = {}
        for fqn, path in leaves.items():
            node = nested
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = flat[fqn]
        return _as_optimizer_state(_listify(nested))

    def _check_pickled(self) -> None:
        """Read every pickled entry weights-only (they are small: groups, counters), so an
        entry that needs code is refused here, even one nothing would use (compare reads
        tensors only; an optimizer state is read only when there is an optimizer)."""
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        flat = {fqn: None for fqn, md in self.metadata.state_dict_metadata.items()
                if not isinstance(md, TensorStorageMetadata)}
        if flat:
            self._load(flat)

    def _load(self, flat: dict) -> None:
        from torch.distributed.checkpoint import CheckpointException, load
        try:
            with warnings.catch_warnings():  # torch warns that no process group is used
                warnings.simplefilter("ignore")
                load(flat, storage_reader=_reader(self.folder, self.metadata),
                     planner=_planner(self.trust, self.folder), no_dist=True)
        except CheckpointException as exc:
            raise _unwrap(exc, self.folder) from None
        except DiagkitError:
            raise
        except Exception as exc:
            raise DiagkitError(f"checkpoint {self.folder} could not be read: "
                               f"{type(exc).__name__}: {brief(exc)}") from None

    def close(self) -> None:
        self._cached = None


class _NoPages:
    """DCP reads each tensor into private memory (freed with it): nothing mapped to hand back."""

    def release(self, key, chunk) -> None:
        pass


def _allocate(md):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    if isinstance(md, TensorStorageMetadata):
        return torch.empty(tuple(md.size), dtype=md.properties.dtype)
    return None  # a pickled object: the planner puts it here


def _listify(node):
    """Dicts whose keys are 0..n-1 as ints (DCP's flattened lists) back into lists."""
    if not isinstance(node, dict):
        return node
    node = {k: _listify(v) for k, v in node.items()}
    if node and all(isinstance(k, int) for k in node) and sorted(node) == list(range(len(node))):
        return [node[i] for i in range(len(node))]
    return node


def _as_optimizer_state(state: dict) -> dict:
    """DCP stores an optimizer's per-parameter state under string keys ('0'); torch's
    `load_state_dict` matches them to the integer ids in `param_groups`."""
    per_param = state.setdefault("state", {})  # none saved (see `_skeleton`)
    if isinstance(per_param, dict):
        state["state"] = {int(k) if isinstance(k, str) and k.isdigit() else k: v
                          for k, v in per_param.items()}
    elif isinstance(per_param, list):  # ids 0..n-1 were listified: back to a mapping
        state["state"] = dict(enumerate(per_param))
    return state


def _unwrap(exc, folder: Path) -> DiagkitError:
    """DCP wraps a rank's exception (here the one process's) in a CheckpointException."""
    failures = getattr(exc, "failures", {}) or {}
    for failure in failures.values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, DiagkitError):
            return inner
        if isinstance(inner, BaseException):
            return DiagkitError(f"checkpoint {folder} could not be read: "
                                f"{type(inner).__name__}: {brief(inner)}")
    return DiagkitError(f"checkpoint {folder} could not be read: {brief(exc)}")


def _reader(folder: Path, metadata):
    """torch's file reader, handed the metadata read here (its own `read_metadata` unpickles
    the file with no allowlist)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(str(folder))


def _planner(trust: bool, folder: Path):
    """torch's load planner, reading pickled entries with weights_only unless `trust` (torch's
    own reads them with weights_only=False)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            try:
                obj = torch.load(value, weights_only=not trust)
            except pickle.UnpicklingError as exc:
                raise unpickling_error(f"{folder} (entry {read_item.dest_index.fqn})",
                                        str(exc)) from None
            if self.flatten_state_dict:  # as torch's own load_bytes does
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                            obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return Planner()
