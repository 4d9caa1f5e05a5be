"""A Hugging Face sharded checkpoint: an index (`model.safetensors.index.json`, or
`pytorch_model.bin.index.json`) whose `weight_map` names the shard file of every tensor, read
one shard at a time.

Memory bound: loading into a model holds the tensors of one shard at a time (a `.safetensors`
shard is read into memory, a `.bin` shard memory-mapped), so peak memory is about the largest
shard. Comparing holds one shard open per side and reads slices of it (`checkpoint_diff`).

Every shard is opened once up front, its header only, so that a missing or damaged shard, or
one that lacks a tensor the index promises, is one line naming the file before anything is
loaded. Tensors a shard holds beyond what the index names are not part of the checkpoint (as
for `transformers`' own loading).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...core.errors import DiagkitError
from ...core.format import brief
from .stream import open_file


def read_index(index: Path) -> dict[str, list[str]]:
    """shard file name -> the tensor names the index puts in it, in the index's order."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DiagkitError(f"shard index {index} is not readable JSON: {brief(exc)}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise DiagkitError(f"shard index {index} has no weight_map (tensor name -> shard file)")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).is_absolute() or ".." in \
                Path(shard).parts:
            raise DiagkitError(f"shard index {index} names {shard!r} as the shard of {name!r}: "
                               "not a file name beside the index")
        shards.setdefault(shard, []).append(name)
    return shards


def read_shard(path: Path, keys: list[str], trust: bool) -> dict[str, torch.Tensor]:
    """The tensors `keys` of one shard file: the only place a shard's tensors are read."""
    file = open_file(path, trust)
    try:
        return file.tensors(keys)
    finally:
        file.close()


class ShardedCheckpoint:
    """The checkpoint an index describes, with the interface of one file (`checkpoint_stream`):
    keys, meta, rows and pages for comparing, pieces (one per shard) and optimizer_state for
    loading."""

    def __init__(self, index: Path, trust: bool):
        self.index, self.trust = Path(index), trust
        self.shards = read_index(self.index)
        self.where: dict[str, str] = {}
        self.metas: dict[str, tuple] = {}
        for shard, names in self.shards.items():
            self._check_shard(shard, names)
        self._open: tuple[str, object] | None = None

    def _path(self, shard: str) -> Path:
        return self.index.parent / shard

    def _check_shard(self, shard: str, names: list[str]) -> None:
        path = self._path(shard)
        if not path.is_file():
            raise DiagkitError(f"shard {path} named by {self.index} is missing")
        file = open_file(path, self.trust)  # a damaged shard: its one-line error, naming it
        try:
            held = set(file.keys())
            lacking = [n for n in names if n not in held]
            if lacking:
                raise DiagkitError(
                    f"shard {path} lacks {len(lacking)} tensor(s) that {self.index.name} puts "
                    f"in it (e.g. {lacking[0]!r}): the shard or the index is stale or damaged")
            for name in names:
                self.where[name] = shard
                self.metas[name] = file.meta(name)
        finally:
            file.close()

    def keys(self) -> list[str]:
        return list(self.where)

    def meta(self, key: str):
        return self.metas[key]

    def _file(self, key: str):
        """The shard holding `key`, open; the one open before it is closed first."""
        shard = self.where[key]
        if self._open is None or self._open[0] != shard:
            self.close()
            self._open = (shard, open_file(self._path(shard), self.trust))
        return self._open[1]

    def rows(self, key: str, start: int | None, stop: int | None) -> torch.Tensor:
        return self._file(key).rows(key, start, stop)

    @property
    def pages(self):
        """The open shard's mapped pages (`rows` opened it)."""
        return self._open[1].pages

    def pieces(self):
        """One piece per shard, in the index's order; the caller drops each before the next."""
        self.close()
        for shard, names in self.shards.items():
            piece = read_shard(self._path(shard), names, self.trust)
            yield piece
            del piece

    def optimizer_state(self) -> None:
        return None  # a sharded model checkpoint holds the weights only

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None
