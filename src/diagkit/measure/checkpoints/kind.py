"""What kind of checkpoint a path is: the one place that decides, for `--checkpoint` and
`compare` alike.

- a file: a PyTorch file or a `.safetensors` file (`checkpoint_stream`);
- a Hugging Face sharded checkpoint: its `*.safetensors.index.json` / `*.bin.index.json`, or
  the folder holding exactly one such index (`checkpoint_shards`); a folder that holds no index
  but exactly one `model.safetensors` / `pytorch_model.bin` (an unsharded `save_pretrained`) is
  that file;
- a `torch.distributed.checkpoint` folder: one with a `.metadata` file, or that file itself
  (`checkpoint_dcp`).

Anything else (no such path, an empty folder, a folder that is none of these) is one line, and
so is a path that is not a regular file or a folder (a FIFO, a device, a socket): refused from
its `stat`, before anything opens it, since opening a FIFO blocks until a writer comes (forever)
and a device such as /dev/zero reads without end. A path the system cannot look up (a symlink
loop, a name too long, a component that is a file) is one line with the system's reason.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

from ...core.errors import DiagkitError
from ...core.paths import kind, lookup, reason

FILE, HF_SHARDED, DCP = "file", "hf_sharded", "dcp"

DCP_METADATA = ".metadata"
_INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
_HF_SINGLE = ("model.safetensors", "pytorch_model.bin")


@dataclasses.dataclass(frozen=True)
class Located:
    """A checkpoint path resolved: its `kind`, and the file or folder that kind reads."""

    kind: str  # FILE, HF_SHARDED or DCP
    path: Path  # the file (FILE), the index file (HF_SHARDED) or the folder (DCP)


def is_index(path) -> bool:
    return Path(path).name.endswith(_INDEX_SUFFIXES)


def locate(path) -> Located:
    """The kind of checkpoint at `path`, or a one-line `DiagkitError` saying why it is none."""
    given = Path(path)
    if stat.S_ISDIR(_stat(given, path).st_mode):
        return _locate_folder(given, path)
    if given.name == DCP_METADATA:
        return Located(DCP, given.parent)
    if is_index(given):
        return Located(HF_SHARDED, given)
    return Located(FILE, given)


def _stat(given: Path, path) -> os.stat_result:
    """`given`'s stat (through symlinks), when it is a folder or a regular file; else the
    one line that says what it is instead, or why the system could not look it up."""
    # a file where a folder should be is said as such ("Not a directory"), not "no such file"
    found = lookup(given, f"checkpoint {path}", absent=(FileNotFoundError,))
    if found is None:
        raise DiagkitError(f"no such checkpoint file or folder: {path}")
    if stat.S_ISDIR(found.st_mode) or stat.S_ISREG(found.st_mode):
        return found
    raise DiagkitError(f"checkpoint {path} is not a regular file ({kind(found.st_mode)}): "
                       "give a checkpoint file or folder")


def _regular(path: Path) -> bool:
    """A regular file (through symlinks); a FIFO, a device or a broken link is not."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _locate_folder(folder: Path, path) -> Located:
    if _regular(folder / DCP_METADATA):
        return Located(DCP, folder)
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError as exc:  # a folder this process may not list
        raise DiagkitError(f"checkpoint folder {path}: {reason(exc)}") from None
    if not names:
        raise DiagkitError(f"checkpoint folder {path} is empty")
    indexes = [n for n in names if is_index(n) and _regular(folder / n)]
    if len(indexes) > 1:
        raise DiagkitError(f"checkpoint folder {path} holds {len(indexes)} shard indexes "
                           f"({', '.join(indexes)}): name the one to read")
    if indexes:
        return Located(HF_SHARDED, folder / indexes[0])
    singles = [n for n in _HF_SINGLE if _regular(folder / n)]
    if len(singles) == 1:
        return Located(FILE, folder / singles[0])
    raise DiagkitError(
        f"checkpoint folder {path} is not a checkpoint diagkit can read: no "
        f"{DCP_METADATA} (a torch.distributed.checkpoint folder), no *.safetensors.index.json "
        f"or *.bin.index.json (a Hugging Face sharded checkpoint), no single "
        f"{' or '.join(_HF_SINGLE)} (it holds {_some(names)})")


def _some(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def open_checkpoint(path, trust: bool = False):
    """Any kind of checkpoint, opened with one interface: `keys()`, `meta(key)` -> (shape,
    dtype), `rows(key, start, stop)` and `pages` (streaming comparison), `pieces()` (the
    tensors, a bounded piece at a time, for loading), `optimizer_state()`, `close()`."""
    found = locate(path)
    if found.kind == HF_SHARDED:
        from .shards import ShardedCheckpoint
        return ShardedCheckpoint(found.path, trust)
    if found.kind == DCP:
        from .dcp import DcpCheckpoint
        return DcpCheckpoint(found.path, trust)
    from .stream import open_file
    return open_file(found.path, trust)
