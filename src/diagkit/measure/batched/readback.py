"""Reading a step's measurements back to the host: one transfer per device (`Pending`).

A measurement of a tensor on the meta device (a shape, no values) reads back as NaN: not
measured, as a dry run on meta reports it (docs/meta.md, "Meta tensors in a real run"). Torch
computes on meta without values, so what was queued of such a tensor costs nothing until here."""

from __future__ import annotations

import math

import numpy as np
import torch


class Pending:
    """Named measurements, read back to the host together: one transfer per device and dtype.

    A measurement is added as a list of 0-d device tensors (what foreach kernels return) or
    as 1-D tensors holding one value per tensor (a bucketed kernel); a name may get several.
    Kept lean: it runs once per observed step, when the CPU's caches are cold from the step's
    own kernels and every Python operation costs several times its warm price.
    """

    def __init__(self):
        self._pieces: list[torch.Tensor] = []
        self._owner: list[str] = []           # the name of each piece
        self._names: dict[str, None] = {}     # every name added, even with nothing

    def add(self, name: str, values) -> None:
        """`values`: a list of 0-d tensors (foreach results) or one 1-D tensor (row norms)."""
        self._names[name] = None
        if isinstance(values, torch.Tensor):
            self._pieces.append(values.reshape(-1))
            self._owner.append(name)
        elif values:
            chunk = _one_dimensional(list(values))
            self._pieces += chunk
            self._owner += [name] * len(chunk)

    def read(self) -> dict[str, np.ndarray]:
        out = readback(self._pieces)
        spans: dict[str, list[tuple[int, int]]] = {}
        at = 0
        for name, piece in zip(self._owner, self._pieces):
            size = piece.numel()
            spans.setdefault(name, []).append((at, at + size))
            at += size
        got = {}
        for name in self._names:
            parts = spans.get(name)
            if not parts:
                got[name] = out[:0]
            elif len(parts) == 1 or all(b == c for (_, b), (c, _) in zip(parts, parts[1:])):
                got[name] = out[parts[0][0]:parts[-1][1]]  # contiguous: a view
            else:
                got[name] = np.concatenate([out[a:b] for a, b in parts])
        return got


def _one_dimensional(chunk: list) -> list[torch.Tensor]:
    if len(chunk) == 1:
        return [chunk[0].reshape(1)]
    try:
        return [torch.stack(chunk)]
    except RuntimeError:  # scalars on several devices (or dtypes): keep them apart
        return [v.reshape(1) for v in chunk]


def readback(pieces: list[torch.Tensor]) -> np.ndarray:
    """Concatenate 1-D device tensors on the host: one transfer per device.

    Mixed dtypes on one device (float32 norms, int32 fingerprints) are widened to float64
    there first, which is exact for both.
    """
    if not pieces:
        return np.empty(0, dtype=np.float64)
    groups: dict[torch.device, list[int]] = {}
    for i, p in enumerate(pieces):
        groups.setdefault(p.device, []).append(i)
    if len(groups) == 1:
        return _to_host(pieces)
    sizes = np.array([p.numel() for p in pieces], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out = np.empty(int(starts[-1]), dtype=np.float64)
    for idx in groups.values():
        at = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in idx])
        out[at] = _to_host([pieces[i] for i in idx])
    return out


def _to_host(pieces: list[torch.Tensor]) -> np.ndarray:
    """One device's pieces, concatenated on the host (NaN for the meta device's: no values)."""
    if pieces[0].is_meta:
        return np.full(sum(p.numel() for p in pieces), np.nan)
    if len({p.dtype for p in pieces}) > 1:
        pieces = [p.to(torch.float64) for p in pieces]
    return torch.cat(pieces).cpu().numpy().astype(np.float64)


def as_float(loss) -> float:
    """A loss the step returned that did not ride along with the read-back (not a one-element
    tensor), as a float: NaN if it is none."""
    try:
        if isinstance(loss, torch.Tensor):
            return float(loss.detach().float().item())
        return float(loss)
    except (TypeError, ValueError, RuntimeError):
        return math.nan
