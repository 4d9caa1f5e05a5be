"""Batched device arithmetic behind the observer and the probes (no hooks here).

Everything returns 0-d device tensors, never Python numbers, so a step's measurements can be
read back to the host in one transfer per device (`diagkit.measure.batched.readback`). An L2 norm is
one fast vectorised pass while an infinity norm is far slower on the CPU, so exact zero checks
use `aminmax`, and only on the few tensors that need them (figures: `benchmarks/README.md`).
"""

from __future__ import annotations

import math

import torch


def dense(t: torch.Tensor) -> torch.Tensor:
    return t.coalesce().values() if t.is_sparse else t


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def is_float(t: torch.Tensor) -> bool:
    """A dtype the snapshot-and-subtract path measures (others: `change_parts`)."""
    return t.dtype in FLOATS


def norm(t: torch.Tensor, dim=None) -> torch.Tensor:
    """L2 norm of any dtype: float32 accumulation for floats of up to 32 bits, float64 for
    float64 (its range: a float32 result would turn 1e-50 into 0 and 1e50 into inf), the
    magnitudes for complex, float64 for everything else (integers, bool, float8)."""
    t = dense(t)
    if t.dtype == torch.float64 or t.is_complex():
        return torch.linalg.vector_norm(t, dim=dim)
    if t.dtype in FLOATS:
        return torch.linalg.vector_norm(t, dim=dim, dtype=torch.float32)
    return torch.linalg.vector_norm(t.to(torch.float64), dim=dim)


def norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms (`norm`), batched; one by one only where foreach can't (sparse, odd dtypes).

    Float32 squares underflow below ~1e-19, so a norm of 0 does not prove "all zero": callers
    confirm zeros with `max_abs` (see `exact_norm`).
    """
    if not tensors:
        return []
    try:
        if all(t.dtype in FLOATS[:3] for t in tensors):
            return list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    except (RuntimeError, TypeError, NotImplementedError):
        pass
    return [norm(t) for t in tensors]


def max_abs(t: torch.Tensor) -> torch.Tensor:
    """max |element| as a 0-d tensor: NaN if any element is NaN, 0 if empty or all zero, and
    never 0 otherwise. Float32 for floats of up to 32 bits and complex64 (exact), float64 for
    the rest (exact for float64, float8, bool and integers below 2^53)."""
    t = dense(t)
    if t.numel() == 0:
        wide = t.dtype == torch.float64 or t.dtype not in FLOATS
        return torch.zeros((), dtype=torch.float64 if wide else torch.float32, device=t.device)
    if t.is_complex():
        t = t.abs()
    if t.dtype == torch.bool:
        return t.any().to(torch.float64)
    if t.dtype not in FLOATS and t.dtype not in _MINMAX_INTS:
        t = t.to(torch.float64)  # float8, uint16/32/64: no aminmax; float64 holds them
    lo, hi = torch.aminmax(t)
    if t.dtype in FLOATS[:3]:
        return torch.maximum(hi, lo.neg()).float()
    return torch.maximum(hi.to(torch.float64), lo.to(torch.float64).neg())


_MINMAX_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def exact_norm(t: torch.Tensor) -> float:
    """L2 norm that neither underflows nor overflows (scaled by the largest element).

    The slow path for the rare tensor whose plain float32 norm came out 0 or infinite: 0 is
    returned only when every element is exactly zero, inf only when an element is infinite.
    """
    t = dense(t)
    m = float(max_abs(t))
    if m == 0 or not math.isfinite(m):
        return m
    scaled = (t.abs() if t.is_complex() else t).to(torch.float64) / m
    return m * float(torch.linalg.vector_norm(scaled))


def copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    _pairwise(torch._foreach_copy_, torch.Tensor.copy_, dst, src)


def sub_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """dst <- dst - src, in place: the snapshot buffer becomes the step's change."""
    _pairwise(torch._foreach_sub_, torch.Tensor.sub_, dst, src)


def _pairwise(batched, one, dst, src) -> None:
    """Batched where foreach can; one pair at a time where it can't (mixed devices, sparse)."""
    if not dst:
        return
    try:
        batched(dst, src)
    except (RuntimeError, TypeError, NotImplementedError):
        for d, s in zip(dst, src):
            one(d, s)


CHECKSUM_CHUNK = 1 << 16  # float64 elements: 512 KiB, a chunk stays in the CPU's L2 cache
SQRT2 = math.sqrt(2.0)


def checksum(t: torch.Tensor) -> torch.Tensor:
    """Sum and sum of squares in float64, folded: equal values give equal checksums, and
    ranks whose copies differ almost never collide.

    On the CPU a large tensor goes through a float64 scratch chunk by chunk (cast, sum, norm
    while in cache: `checksum_parts`): a whole float64 copy and its square cost 4.7x as much,
    61 ms per observed step on the 17M-parameter GPT under DDP (benchmarks/README.md, section
    M). The exact probe's snapshot pass takes the same chunks of the tensors it reads anyway
    (`chunked_checksum`), the same way, so ranks agree whichever took it. The chunks depend
    only on the tensor's size, so equal values still give equal checksums."""
    x = dense(t.detach())
    if x.is_complex():
        x = torch.view_as_real(x)
    if not chunked_checksum(x):
        x = x.to(torch.float64)
        return x.sum() + x.square().sum() * SQRT2
    flat, scratch = x.reshape(-1), checksum_scratch()
    return fold_checksum([checksum_parts(flat[at:at + CHECKSUM_CHUNK], scratch)
                          for at in range(0, flat.numel(), CHECKSUM_CHUNK)])


def chunked_checksum(t: torch.Tensor) -> bool:
    """Whether `checksum` takes `t` chunk by chunk (a CPU tensor of more than one chunk).
    Whoever offers a checksum in its place must take exactly these, chunk for chunk."""
    return t.device.type == "cpu" and t.numel() > CHECKSUM_CHUNK


def checksum_scratch() -> torch.Tensor:
    """The float64 chunk a checksum's values are cast into (torch's allocation: every one
    aligned alike, so a sum cannot round differently between two takers)."""
    return torch.empty(CHECKSUM_CHUNK, dtype=torch.float64)


def checksum_parts(part: torch.Tensor, scratch: torch.Tensor) -> tuple:
    """One chunk's float64 sum and L2 norm (0-d tensors), cast through `scratch`."""
    buf = scratch[:part.numel()]
    buf.copy_(part)
    return buf.sum(), torch.linalg.vector_norm(buf)


def fold_checksum(parts: list[tuple]) -> torch.Tensor:
    """The chunks' parts as one checksum: sum + sqrt(2) x sum of squares."""
    sums, norms_ = zip(*parts)
    return torch.stack(sums).sum() + torch.stack(norms_).square().sum() * SQRT2


def row_norms(matrix: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each row of a (count, *shape) stack, one kernel (`norm` for dtypes)."""
    return norm(matrix.reshape(len(matrix), -1), dim=1)
