"""The exact probe's snapshot of large tensors: its buffers, and one pass over it on the CPU at
the end of an observed step (the change, then the refresh).

The exact probe keeps each large tensor's value before the step in a snapshot buffer. At the
end of the step it needs three things of it: the norm of `before - now`, the snapshot set to
`now` (the next step's `before`), and the norm of `now`. Done as four whole-tensor torch
operations that is seven passes over memory (a 17M-parameter model: 64 MiB each); done chunk
by chunk while a chunk is in the cache it is three (read both, write the snapshot). Torch
pays ~5 us per operation on the CPU, which over 256 chunks ate the gain; numpy pays ~1 us
and works on the same memory (`Tensor.numpy()` is a view). Figures: benchmarks/README.md,
"Issue 25: the snapshot pass".

Exactness is the rare path's, chunk by chunk: a chunk whose float sum of squares is 0, inf or
NaN is decided element-wise while its difference still exists (`chunk_change`), with the same
semantics as `exact_probe.ExactProbe.resolve_into` gives a whole tensor.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..batched import kernels
from .parts import nonfinite_change

CHUNK = 1 << 16  # elements: 256 KiB of float32 per operand, both operands stay in L2
DTYPES = (torch.float32, torch.float64)  # numpy's own: float16 sums badly, bfloat16 is absent
PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a subclass whose `numpy()` means otherwise


def fits(before: torch.Tensor, now: torch.Tensor) -> bool:
    """Whether the pair can take the chunked pass: plain dense CPU tensors of one numpy dtype,
    contiguous, no lazy negative bit (`numpy()` would refuse them)."""
    return (type(now) in PLAIN and type(before) in PLAIN
            and now.device.type == "cpu" and before.device.type == "cpu"
            and now.dtype in DTYPES and before.dtype == now.dtype
            and now.layout == torch.strided and now.is_contiguous()
            and before.is_contiguous() and not now.is_neg() and now.numel() > 0
            and now.numel() == before.numel())


class Change:
    """What one pass found: the L2 norm of the change (float64; 0 exactly when no element
    changed, NaN equal to NaN; inf when one changed to or from NaN or inf), the L2 norm of
    the value now, and the value's `kernels.checksum` where one was asked for (else None)."""

    __slots__ = ("norm", "value", "checksum")

    def __init__(self, norm: float, value: float, checksum: torch.Tensor | None = None):
        self.norm, self.value, self.checksum = norm, value, checksum

    rare = property(lambda self: not 0 < self.norm < math.inf,
                    doc="0 or inf: what the float path alone could not have decided.")


def change_and_refresh(before: torch.Tensor, now: torch.Tensor,
                       before_had_nan: bool = False, checksum: bool = False) -> Change:
    """`before` (a snapshot buffer) becomes `now`; returns the change from the old `before`.
    `before_had_nan`: its norm was NaN. The exact probe decides a tensor known to hold NaN
    element-wise from both values instead (`change_parts`, its `careful` set); without that
    knowledge a chunk is decided as `nonfinite_change` decides a whole tensor.

    `checksum`: also take `now`'s `kernels.checksum` while each chunk is in cache, where it is
    the same number (`takes_checksum`); under a process group that was a pass of its own over
    every value (benchmarks/README.md, "Issue 25, later")."""
    b = before.detach().reshape(-1).numpy()
    a = now.detach().reshape(-1).numpy()
    parts: list[float] = []   # each chunk's change norm: combined with hypot (no overflow)
    value_sq = 0.0
    scratch = kernels.checksum_scratch() if checksum and takes_checksum(now) else None
    sums: list[tuple] = []
    with np.errstate(all="ignore"):  # inf - inf and overflow: decided below, not warned
        for at in range(0, b.size, CHUNK):
            x, y = b[at:at + CHUNK], a[at:at + CHUNK]
            np.subtract(x, y, out=x)
            q = float(np.dot(x, x))
            # 0, inf or NaN: underflow, overflow, or a change to or from NaN or inf
            parts.append(math.sqrt(q) if 0 < q < math.inf
                         else chunk_change(x, y, before_had_nan))
            np.copyto(x, y)
            value_sq += float(np.dot(x, x))
            if scratch is not None:
                sums.append(kernels.checksum_parts(torch.from_numpy(y), scratch))
    return Change(math.hypot(*parts), math.sqrt(value_sq),
                  kernels.fold_checksum(sums) if scratch is not None else None)


def takes_checksum(now: torch.Tensor) -> bool:
    """Whether the pass over `now` can give its `kernels.checksum`: the checksum goes chunk by
    chunk there, and the pass's chunks are the checksum's (a test's tiny chunks are not)."""
    return CHUNK == kernels.CHECKSUM_CHUNK and kernels.chunked_checksum(now)


def chunk_change(diff: np.ndarray, now: np.ndarray, before_had_nan: bool) -> float:
    """One chunk's change norm from its difference and its value now, as the exact probe's
    rare path decides a whole tensor: NaN in the difference through `nonfinite_change` (inf
    for a change to or from NaN), else the overflow- and underflow-free `exact_norm`."""
    d, n = torch.from_numpy(diff), torch.from_numpy(now)
    if np.isnan(diff).any():
        return nonfinite_change(d, n, before_had_nan)[1]
    return kernels.exact_norm(d)


def buffers(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Snapshot buffers shaped like `tensors`, carved from one allocation per device and dtype.

    One large block sits outside the heap the training step allocates its gradients and
    activations from (malloc maps it on its own), instead of dozens of tensor-sized holes in it
    that move where each step's allocations land and slow the step down.
    """
    out: list[torch.Tensor | None] = [None] * len(tensors)
    kinds: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        kinds.setdefault((t.device, t.dtype), []).append(i)
    for (device, dtype), idx in kinds.items():
        flat = torch.empty(sum(tensors[i].numel() for i in idx), dtype=dtype, device=device)
        at = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = flat[at:at + n].view(tensors[i].shape)
            at += n
    return out
