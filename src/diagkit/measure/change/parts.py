"""The exact change of one tensor from its values before and after, element by element.

`exact_probe` decides most tensors from the norm of `before - after`, computed in place in the
snapshot. What that cannot decide comes here while both values still exist: dtypes it does not
subtract (integers, bool, complex, float8), and float tensors that hold NaN or inf, or values
so large that the subtraction could overflow (`RISK`). Semantics, as the schema documents them:
`changed` compares values, with NaN equal to NaN; the change's norm is 0 only when unchanged,
inf when a value changed to or from NaN or ±inf.
"""

from __future__ import annotations

import math

import torch

from ..batched.kernels import exact_norm, norm

# Per float dtype, a norm of the value before below which `before - after` cannot overflow
# for any finite value after (half the distance between the two largest values: 2^103 for
# float32). float16's is half its range instead: its exact bound (16) is below most tensors'
# norms, and would send them all down the slow path (see docs/cost.md, "Cost of observation").
RISK = {torch.float16: 32752.0, torch.bfloat16: 2.0**119, torch.float32: 2.0**103,
        torch.float64: 2.0**969}


def change_parts(before: torch.Tensor, after: torch.Tensor) -> list[torch.Tensor]:
    """[changed (1.0 or 0.0), the change's L2 norm, the norm of `before`]: float64 device
    scalars, nothing read back."""
    if before.dtype == torch.bool or not (before.is_floating_point() or before.is_complex()):
        return _integer_parts(before, after)
    b, a = _wide(before), _wide(after)
    same = (b == a) | (torch.isnan(b) & torch.isnan(a))
    differs = ~same
    finite = torch.isfinite(b) & torch.isfinite(a)
    moved = differs & finite
    d = torch.where(moved, b - a, 0.0)  # overflows only where the true norm is past float64's
    if before.dtype == torch.float64:  # squares past 1e154 would overflow: scale
        size = _scaled_norm(d)
    else:  # values of up to 32 bits: their squares are far inside float64's range
        size = torch.linalg.vector_norm(d)
    size = torch.where((differs & ~finite).any(), math.inf, size)
    return [differs.any().double(), size, norm(b).double()]


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float64 values (a complex tensor as its real and imaginary parts)."""
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128))
    return t.to(torch.float64)


def _scaled_norm(d: torch.Tensor) -> torch.Tensor:
    """L2 norm of finite float64 values that neither underflows nor overflows: scaled by the
    largest; inf where an element is inf (an overflowed difference)."""
    m = d.abs().amax() if d.numel() else torch.zeros((), dtype=d.dtype, device=d.device)
    safe = torch.where((m > 0) & torch.isfinite(m), m, 1.0)
    return torch.where(m > 0, m * torch.linalg.vector_norm(d / safe), 0.0).where(
        torch.isfinite(m), math.inf)


def _integer_parts(before: torch.Tensor, after: torch.Tensor) -> list[torch.Tensor]:
    """Integers and bool: changed by `!=`, the difference in float64 (int64 exact where it
    does not overflow; a uint64 difference too small for float64 at its size: NaN)."""
    changed = torch.ne(before, after).any()
    if before.dtype == torch.bool:
        d = torch.ne(before, after).double()
    elif before.dtype == torch.uint64:
        d = before.double() - after.double()
    elif before.dtype == torch.int64:
        rough = before.double() - after.double()
        d = torch.where(rough.abs() < 2.0**62, (before - after).double(), rough)
    else:
        d = (before.to(torch.int64) - after.to(torch.int64)).double()
    size = torch.linalg.vector_norm(d)
    size = torch.where(changed & (size == 0), math.nan, size)
    return [changed.double(), size, norm(before).double()]


def row_change_norms(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Per row of two (rows, n) stacks of samples, the change's L2 norm with the semantics
    above (float64: NaN equal to NaN, inf for a change to or from NaN or inf). Each row is
    scaled by its largest element first, as `kernels.exact_norm` does: squares of float64
    changes under ~1e-154 underflow to 0, which would read as a change that missed the
    sample."""
    b, a = _wide(before).reshape(len(before), -1), _wide(after).reshape(len(after), -1)
    same = (b == a) | (torch.isnan(b) & torch.isnan(a))
    finite = torch.isfinite(b) & torch.isfinite(a)
    diff = torch.where(~same & finite, b - a, 0.0)
    scale = (diff.abs().amax(dim=1, keepdim=True) if diff.shape[1]
             else torch.ones(len(diff), 1, dtype=diff.dtype))
    scale = torch.where((scale > 0) & torch.isfinite(scale), scale, 1.0)
    size = torch.linalg.vector_norm(diff / scale, dim=1) * scale.squeeze(1)
    return torch.where((~same & ~finite).any(dim=1), math.inf, size)


def nonfinite_change(diff: torch.Tensor, after: torch.Tensor,
                      before_had_nan: bool) -> tuple[bool, float]:
    """Exact change of a tensor whose `before - after` holds NaN, from that and `after` (a
    host read: the rare path). NaN comes from inf - inf of the same sign (unchanged) or from a
    NaN on either side. The tensors known to hold NaN before the step never come here (they
    are decided in `end()` by `change_parts`), so without a NaN before, a NaN position
    changed exactly when the value is NaN now, and the change's norm is then inf. A tensor that
    came to hold NaN while unobserved, off the CPU, is decided as well as `diff` and `after`
    allow: a finite value where the difference is NaN is a change, a NaN is taken as NaN before.
    """
    nan = torch.isnan(diff)
    size = exact_norm(torch.where(nan, 0.0, diff))
    if before_had_nan:
        nan_change = bool((nan & torch.isfinite(after)).any())
    else:
        nan_change = bool((nan & torch.isnan(after)).any())
    return size != 0 or nan_change, math.inf if nan_change else size
