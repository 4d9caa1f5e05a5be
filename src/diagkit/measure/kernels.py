"""Batched device arithmetic behind the observer and the probes (no hooks here).

Everything returns 0-d device tensors, never Python numbers, so a step's measurements can be
read back to the host in one transfer per device (`diagkit.measure.readback`). An L2 norm is
one fast vectorised pass while an infinity norm is far slower on the CPU, so exact zero checks
use `aminmax`, and only on the few tensors that need them (figures: `benchmarks/README.md`).
"""

from __future__ import annotations

import math

import torch


def dense(t: torch.Tensor) -> torch.Tensor:
    return t.coalesce().values() if t.is_sparse else t


def norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Float32 L2 norms, batched; one by one only where foreach can't (sparse, odd dtypes).

    Float32 squares underflow below ~1e-19, so a norm of 0 does not prove "all zero": callers
    confirm zeros with `max_abs` (see `exact_norm`).
    """
    if not tensors:
        return []
    try:
        return list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    except (RuntimeError, TypeError, NotImplementedError):
        return [torch.linalg.vector_norm(dense(t).float()) for t in tensors]


def max_abs(t: torch.Tensor) -> torch.Tensor:
    """max |element| as a float32 0-d tensor: exact, NaN if any element is NaN, 0 if empty."""
    t = dense(t)
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=t.device)
    if not (t.is_floating_point() or t.is_complex()):
        return t.ne(0).any().float()
    if t.is_complex():
        t = t.abs()
    lo, hi = torch.aminmax(t)
    return torch.maximum(hi, lo.neg()).float()


def exact_norm(t: torch.Tensor) -> float:
    """L2 norm that neither underflows nor overflows (scaled by the largest element).

    The slow path for the rare tensor whose plain float32 norm came out 0 or infinite: 0 is
    returned only when every element is exactly zero, inf only when an element is infinite.
    """
    t = dense(t)
    m = float(max_abs(t))
    if m == 0 or not math.isfinite(m):
        return m
    scaled = t.to(torch.float64) / m if not t.is_complex() else t.abs().to(torch.float64) / m
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


def checksum(t: torch.Tensor) -> torch.Tensor:
    """Sum and sum of squares in float64, folded: equal values give equal checksums, and
    ranks whose copies differ almost never collide."""
    x = t.detach().to(torch.float64)
    return x.sum() + x.square().sum() * math.sqrt(2.0)


def row_norms(matrix: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(matrix.reshape(len(matrix), -1), dim=1, dtype=torch.float32)
