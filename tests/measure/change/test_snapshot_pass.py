"""`snapshot_pass.change_and_refresh` against a brute-force float64 oracle (hypothesis).

Small chunks (`CHUNK` set to 1-5 elements) put ordinary, underflowing, overflowing, NaN and
inf chunks side by side in one tensor: the pass must still give the whole tensor's exact
answer, leave the snapshot equal to the value now, bit for bit, and the value's norm.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagkit.measure.batched import kernels
from diagkit.measure.change import snapshot_pass

ORACLE = settings(derandomize=True, max_examples=300, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])


def oracle(before: np.ndarray, now: np.ndarray) -> float:
    """The change's norm by value: NaN equal to NaN, ±0 equal, inf for a change to or from
    a non-finite value, else the float64 norm of the differences, scaled (no underflow)."""
    b, a = before.astype(np.float64), now.astype(np.float64)
    moved = ~((b == a) | (np.isnan(b) & np.isnan(a)))
    if not moved.any():
        return 0.0
    if not (np.isfinite(b[moved]).all() and np.isfinite(a[moved]).all()):
        return math.inf
    d = before[moved].astype(np.float64) - now[moved].astype(np.float64)
    if before.dtype == np.float32:  # the change is taken in the tensor's own dtype
        d = (before[moved] - now[moved]).astype(np.float64)
        if not np.isfinite(d).all():  # float32 overflowed where float64 did not
            d = b[moved] - a[moved]
    m = np.abs(d).max()
    return float(m * np.sqrt(np.sum((d / m) ** 2)))


def special(dtype):
    info = np.finfo(dtype)
    return [0.0, -0.0, 1.0, -1.5, math.nan, math.inf, -math.inf, float(info.tiny),
            float(info.smallest_subnormal), float(info.max), -float(info.max), 1e-30, 3e19]


@st.composite
def pairs(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(1, 24))
    value = st.one_of(st.sampled_from(special(dtype)),
                      st.floats(width=32 if dtype == np.float32 else 64))
    with np.errstate(over="ignore"):
        before = np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=dtype)
    before[np.isnan(before)] = 2.0  # a NaN before is decided element-wise, never here
    now = before.copy()
    for i in draw(st.lists(st.integers(0, n - 1), max_size=6)):
        with np.errstate(over="ignore"):
            now[i] = dtype(draw(st.one_of(value, st.just(float(before[i]) * (1 + 1e-6)))))
    return before, now, draw(st.integers(1, 5))


@ORACLE
@given(case=pairs())
def test_the_pass_agrees_with_the_oracle(case):
    before, now, chunk = case
    snap, value = torch.from_numpy(before.copy()), torch.from_numpy(now.copy())
    was = snapshot_pass.CHUNK
    snapshot_pass.CHUNK = chunk
    try:
        got = snapshot_pass.change_and_refresh(snap, value)
    finally:
        snapshot_pass.CHUNK = was
    want = oracle(before, now)
    if want == 0 or math.isinf(want):
        assert got.norm == want, (before, now, got.norm)
    else:
        assert got.norm == pytest.approx(want, rel=1e-5), (before, now)
    assert got.rare == (want == 0 or math.isinf(want))
    assert snap.numpy().tobytes() == now.tobytes()  # the next step's snapshot, bit for bit
    with np.errstate(over="ignore", invalid="ignore"):
        norm_now = float(np.sqrt(np.sum(now.astype(np.float64) ** 2)))
    if math.isfinite(norm_now) and norm_now < 1e18:  # float32 squares overflow past ~1.8e19
        assert got.value == pytest.approx(norm_now, rel=1e-5)
    else:
        assert not got.value < 1e18


def test_what_the_pass_takes():
    """Dense contiguous CPU float32/float64 pairs only: the rest keep torch's own path."""
    x = torch.zeros(4)
    assert snapshot_pass.fits(x.clone(), x)
    assert not snapshot_pass.fits(x.clone().half(), x.half())
    assert not snapshot_pass.fits(torch.zeros(2, 2), torch.zeros(2, 2).t())  # not contiguous
    assert not snapshot_pass.fits(torch.zeros(0), torch.zeros(0))
    assert not snapshot_pass.fits(x.clone(), x.double())
    assert snapshot_pass.fits(x.clone(), torch.nn.Parameter(x))

    class Wrapped(torch.Tensor):
        pass
    assert not snapshot_pass.fits(x.clone(), x.as_subclass(Wrapped))


@st.composite
def large_values(draw):
    """A value of one to three checksum chunks and a tail, at an offset in its storage, with
    special values (NaN, inf, subnormal, huge) dropped in at a few positions."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    n = draw(st.integers(kernels.CHECKSUM_CHUNK + 1, 3 * kernels.CHECKSUM_CHUNK + 17))
    offset = draw(st.integers(0, 5))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    base = torch.randn(n + offset, generator=gen, dtype=dtype) * draw(
        st.sampled_from([1e-3, 1.0, 1e4]))
    now = base[offset:]
    for at, v in draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(
            special(np.float32 if dtype == torch.float32 else np.float64))), max_size=4)):
        now[at] = v
    return now


@settings(derandomize=True, max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(now=large_values())
def test_the_checksum_taken_in_passing_is_the_kernels_own(now):
    """Ranks compare checksums that one rank may take in the pass and another apart
    (`kernels.checksum`): for the same values both must give the same number, bit for bit."""
    before = snapshot_pass.buffers([now])[0]
    before.copy_(now * 0.5)
    got = snapshot_pass.change_and_refresh(before, now, checksum=True)
    want = float(kernels.checksum(now.clone()))
    assert got.checksum is not None
    took = float(got.checksum)
    assert took == want or (math.isnan(took) and math.isnan(want))
    assert torch.equal(before, now) or torch.equal(before.isnan(), now.isnan())


def test_the_pass_takes_no_checksum_unasked_or_on_other_chunks(monkeypatch):
    now = torch.randn(kernels.CHECKSUM_CHUNK + 3)
    before = torch.zeros_like(now)
    assert snapshot_pass.change_and_refresh(before, now).checksum is None
    small = torch.randn(kernels.CHECKSUM_CHUNK)  # one chunk: `checksum`'s own small path
    assert snapshot_pass.change_and_refresh(torch.zeros_like(small), small,
                                            checksum=True).checksum is None
    monkeypatch.setattr(snapshot_pass, "CHUNK", 5)  # chunks other than the checksum's
    assert snapshot_pass.change_and_refresh(before, now, checksum=True).checksum is None
