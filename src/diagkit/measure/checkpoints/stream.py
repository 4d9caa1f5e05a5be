"""Checkpoint files read lazily, a slice at a time, for comparing two of them without holding
either in memory, and whole, for loading one into a model (`pieces`: one piece, the file): a
PyTorch zip checkpoint memory-mapped (`torch.load(..., mmap=True)` through `read_checkpoint`,
so bad files get its one-line errors), a `.safetensors` file one key at a time; the mapped
pages of a measured slice are handed back to the kernel. (A legacy, non-zip `.pt` file cannot
be mapped and is loaded whole.)"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import torch

from ...core.errors import DiagkitError
from ...core.format import brief
from .read import find_optimizer_state, find_state_dict, openable_name
from .read import read_checkpoint

# safetensors' dtype names (its file format's) -> torch's; a name this torch lacks stays a string
SAFETENSORS_DTYPES = {name: getattr(torch, attr) for name, attr in (
    ("F64", "float64"), ("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16"),
    ("I64", "int64"), ("I32", "int32"), ("I16", "int16"), ("I8", "int8"), ("U8", "uint8"),
    ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"), ("BOOL", "bool"),
    ("F8_E4M3", "float8_e4m3fn"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2", "float8_e5m2"),
    ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("C64", "complex64")) if hasattr(torch, attr)}


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):  # pragma: no cover
        return None


_LIBC = _libc()


_MADV_DONTNEED = 4


class _MappedPages:
    """Hands the pages of a measured slice back to the kernel, when the slice lies in this
    process's private mapping of the checkpoint file (torch.load's mmap, safetensors' reads).

    The pages stay in the page cache and are read again from the file if touched; a private
    mapping that was never written holds nothing else. A slice anywhere else (a copy, a tensor
    built by trusted unpickling code) is left alone. Linux only; elsewhere a no-op.
    """

    def __init__(self, path):
        st = os.stat(path)
        self.file = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        self.ranges: list[tuple[int, int]] = []
        self.looked: set[str] = set()

    def _read_maps(self) -> None:
        ranges = []
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 6 or not parts[1].endswith("p"):
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                if (major, minor, int(parts[4])) == self.file:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    ranges.append((lo, hi))
        self.ranges = ranges

    def release(self, key: str, chunk: torch.Tensor) -> None:
        if _LIBC is None:
            return
        page = mmap.PAGESIZE
        start = chunk.data_ptr()
        stop = start + chunk.numel() * chunk.element_size()
        start, stop = -(-start // page) * page, stop // page * page
        if stop <= start:
            return
        inside = any(lo <= start and stop <= hi for lo, hi in self.ranges)
        if not inside and key not in self.looked:  # a mapping made since: look once per tensor
            self.looked.add(key)
            self._read_maps()
            inside = any(lo <= start and stop <= hi for lo, hi in self.ranges)
        if inside:
            _LIBC.madvise(start, stop - start, _MADV_DONTNEED)


class _TorchFile:
    """A PyTorch checkpoint: read_checkpoint memory-maps it (torch.save's zip format), so a
    tensor's bytes are read only when a slice of it is measured."""

    def __init__(self, path, trust: bool):
        obj = read_checkpoint(path, trust)
        self.state = find_state_dict(obj, str(path))
        self.optimizer = find_optimizer_state(obj)
        self.pages = _MappedPages(path)

    def keys(self) -> list[str]:
        return list(self.state)

    def meta(self, key: str) -> tuple[tuple[int, ...], torch.dtype]:
        t = self.state[key]
        return tuple(t.shape), t.dtype

    def rows(self, key: str, start: int | None, stop: int | None) -> torch.Tensor:
        t = self.state[key]
        if t.is_quantized:
            t = t.dequantize()
        elif t.layout != torch.strided:
            t = t.to_dense()
        return (t if start is None else t[start:stop]).reshape(-1)

    def tensors(self, keys) -> dict[str, torch.Tensor]:
        return {k: self.state[k] for k in keys}

    def pieces(self):
        """The whole state dict, as one piece (memory-mapped where the file allows)."""
        yield dict(self.state)

    def optimizer_state(self) -> dict | None:
        return self.optimizer

    def close(self) -> None:
        self.state, self.optimizer = {}, None


class _SafetensorsFile:
    """A `.safetensors` file, read one key (or a block of rows) at a time."""

    def __init__(self, path):
        from safetensors import safe_open
        file = Path(path)
        if not file.is_file() or file.stat().st_size == 0:
            read_checkpoint(path)  # raises its one-line error for a missing or empty file
        with openable_name(path) as name:  # a name that is not UTF-8: by its descriptor
            try:
                self.handle = safe_open(name, framework="pt")
                self._keys = list(self.handle.keys())
            except Exception as exc:
                raise DiagkitError(f"checkpoint {path} is not a readable safetensors file: "
                                   f"{type(exc).__name__}: {brief(exc)}") from None
        if not self._keys:
            raise DiagkitError(f"checkpoint {path} holds no tensors")
        self.pages = _MappedPages(path)

    def keys(self) -> list[str]:
        return self._keys

    def meta(self, key: str) -> tuple[tuple[int, ...], torch.dtype | str]:
        sl = self.handle.get_slice(key)
        return tuple(sl.get_shape()), SAFETENSORS_DTYPES.get(sl.get_dtype(), sl.get_dtype())

    def rows(self, key: str, start: int | None, stop: int | None) -> torch.Tensor:
        if start is None:
            return self.handle.get_tensor(key).reshape(-1)
        return self.handle.get_slice(key)[start:stop].reshape(-1)

    def tensors(self, keys) -> dict[str, torch.Tensor]:
        return {k: self.handle.get_tensor(k) for k in keys}

    def pieces(self):
        """The whole file, as one piece."""
        yield self.tensors(self._keys)

    def optimizer_state(self) -> None:
        return None  # a safetensors file holds tensors only

    def close(self) -> None:
        self.handle = None


def itemsize(dtype) -> int:
    """Bytes per element of a dtype from `meta` (0 for a safetensors dtype torch lacks)."""
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 0


def _is_safetensors(path) -> bool:
    """By suffix, or by content: an 8-byte little-endian header length, then a JSON object."""
    if str(path).endswith(".safetensors"):
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < size


def open_file(path, trust: bool):
    """One checkpoint file, of either format (`checkpoint_kind.open_checkpoint` opens any kind)."""
    return _SafetensorsFile(path) if _is_safetensors(path) else _TorchFile(path, trust)
