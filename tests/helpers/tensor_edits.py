"""Random tiny tensors of every dtype diagkit measures and random in-place edits of them
(hypothesis strategies), shared by the probes' oracle tests (tests/measure/change/): `tensors`,
`edits(ts)`, `apply(ts, edits)`, and `ORACLE`, the settings that keep them deterministic."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]
DTYPES = FLOATS + INTS + [torch.complex64]
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
SHAPES = [(0,), (), (1,), (3,), (2, 2), (5,), (2, 3), (7,)]
ORACLE = settings(derandomize=True, max_examples=100, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def special(dtype: torch.dtype) -> list[float]:
    info = torch.finfo(dtype)
    return [0.0, -0.0, 1.0, -1.0, 0.5, math.nan, math.inf, -math.inf, info.tiny,
            info.tiny * info.eps, -info.tiny * info.eps, info.max, -info.max, 3.0, 1e-30, 7e4]


def values(dtype: torch.dtype):
    """A strategy for one element's value, as a Python number."""
    if dtype == torch.bool:
        return st.booleans()
    if not (dtype.is_floating_point or dtype.is_complex):
        info = torch.iinfo(dtype)
        return st.one_of(st.integers(info.min, info.max), st.sampled_from([0, 1, info.max]))
    real = torch.float32 if dtype.is_complex else dtype
    width = 64 if real == torch.float64 else 32
    return st.one_of(st.sampled_from(special(real)), st.floats(width=width))


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from(SHAPES))
    n = math.prod(shape)
    elems = draw(st.lists(values(dtype), min_size=n * 2, max_size=n * 2))
    if dtype.is_complex:
        base = torch.complex(torch.tensor(elems[:n], dtype=torch.float32),
                             torch.tensor(elems[n:], dtype=torch.float32))
    else:
        with np.errstate(over="ignore"):
            base = torch.tensor(elems[:n], dtype=torch.float64 if dtype.is_floating_point
                                else torch.int64 if dtype != torch.bool else torch.bool)
        base = base.to(dtype)
    base = base.reshape(shape)
    if len(shape) == 2 and draw(st.booleans()):
        base = base.t().contiguous().t()  # the same values, not contiguous
    elif len(shape) == 1 and n and draw(st.booleans()):
        wide = torch.zeros(2 * n, dtype=dtype)
        wide[::2] = base
        base = wide[::2]  # a strided view of a larger tensor
    return base


@st.composite
def edits(draw, ts):
    """A list of in-place edits: (kind, tensor index, element indices, value or bit)."""
    out = []
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(0, len(ts) - 1))
        n = ts[k].numel()
        if n == 0:
            continue
        kind = draw(st.sampled_from(["set", "negate_pair", "bit", "nan_in", "nan_out", "same"]))
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        arg = draw(values(ts[k].dtype)) if kind == "set" else \
            draw(st.integers(0, 8 * ts[k].element_size() - 1))
        out.append((kind, k, i, j, arg))
    return out


def apply(ts, edit_list) -> None:
    for kind, k, i, j, arg in edit_list:
        t = ts[k]
        at = [np.unravel_index(x, t.shape) if t.dim() else () for x in (i, j)]
        one = t[at[0]].clone().reshape(1)
        if kind == "set":
            one[0] = arg
        elif kind == "same":
            pass
        elif kind == "negate_pair":
            if t.dtype == torch.bool:
                t[at[1]] = ~t[at[1]]
                one[0] = ~one[0]
            elif t.dtype == torch.uint8:
                continue
            else:
                t[at[1]] = -t[at[1]]
                one[0] = -one[0]
        elif kind == "bit":
            bits = one.view(BITS[t.element_size()]) if t.dtype != torch.complex64 \
                else torch.view_as_real(one).view(torch.int32)
            b = arg % (8 * bits.element_size())
            if t.dtype == torch.bool:
                one[0] = ~one[0]
            else:
                bits[0] ^= (1 << b) if b < 8 * bits.element_size() - 1 else -(1 << b)
        elif kind in ("nan_in", "nan_out"):
            if not (t.dtype.is_floating_point or t.dtype.is_complex):
                continue
            one[0] = math.nan if kind == "nan_in" else 2.0
        t[at[0]] = one[0]
