"""The delta probes against a brute-force oracle, with property-based tests (hypothesis).

Random tiny tensors of every dtype diagkit measures (float32/64, bfloat16, float16, integers,
bool, complex; empty, non-contiguous, ±0, subnormals, NaN, ±inf, the largest values) get
random in-place edits over a few steps (single elements, sign flips of pairs, bit flips, NaN
in and out, values changed while unobserved). For every `delta` mode the probe must agree with
the oracle, as docs/cost.md, "Cost of observation", states it:

- `changed`: any element differs, NaN equal to NaN, +0.0 equal to -0.0 (a snapshot: exact
  mode, and tensors of at most `sample` elements in the other modes); bitwise for the
  fingerprinted tensors of `sampled`/`off` and for integers and bool in every mode (+0.0 ->
  -0.0 and a NaN payload count). Never missed: the fingerprint's chance to miss is below
  2^-73, far beyond what a test can see.
- `delta_norm` (snapshots): 0 when unchanged, inf when a value changed to or from NaN or inf,
  else the float64 norm of the change. `sampled`, fingerprinted: the sample's own change norm
  scaled by sqrt(numel / sample), NaN when the change missed the sample (and for dtypes that
  are not sampled: integers, bool, complex). `off`: NaN throughout.

Deterministic (derandomize) and bounded, so it runs in every `make test` in a few seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from diagkit.measure.change.probes import make_probe
from diagkit.measure.batched.readback import Pending

from tensor_edits import BITS, ORACLE, apply, edits, tensors

SAMPLE = 4  # sampled/off: tensors of at most 4 elements are snapshots, larger ones fingerprinted
def wide(t: torch.Tensor) -> np.ndarray:
    """float64 values (complex: real and imaginary parts), or Python ints for integers."""
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128)).numpy().reshape(-1)
    if t.dtype.is_floating_point:
        return t.to(torch.float64).numpy().reshape(-1)
    return np.array([int(v) for v in t.reshape(-1).tolist()], dtype=object)


def oracle_change(before: torch.Tensor, after: torch.Tensor) -> tuple[bool, float]:
    """(changed, delta_norm) by value: NaN equal to NaN, ±0 equal, inf for non-finite."""
    b, a = wide(before), wide(after)
    if b.dtype == object:
        d = [float(x - y) for x, y in zip(b, a)]
        return any(d), math.sqrt(sum(x * x for x in d))
    same = (b == a) | (np.isnan(b) & np.isnan(a))
    if same.all():
        return False, 0.0
    moved = ~same
    if not (np.isfinite(b[moved]).all() and np.isfinite(a[moved]).all()):
        return True, math.inf
    d = b[moved] - a[moved]
    m = np.abs(d).max()
    return True, float(m * np.sqrt(np.sum((d / m) ** 2)))


def bits_differ(before: torch.Tensor, after: torch.Tensor) -> bool:
    view = BITS[1] if before.element_size() == 1 else torch.uint8

    def flat(t):  # a fresh contiguous copy (one element keeps its stride in a plain clone)
        return t.reshape(-1).clone(memory_format=torch.contiguous_format).view(view)
    return not torch.equal(flat(before), flat(after))


def run_step(probe, ts, edit_list, consecutive):
    before = [t.clone() for t in ts]
    probe.begin(consecutive=consecutive)
    with torch.no_grad():
        apply(ts, edit_list)
    pending = Pending()
    probe.end(pending)
    delta, changed, _ = probe.resolve(pending.read())
    return before, delta, changed


def sample_estimate(probe, k, before, after) -> float:
    """What `sampled` must report for fingerprinted tensor k: its sample's change, scaled."""
    idx = probe._idx[probe.sampled.index(k)]
    _, size = oracle_change(before.reshape(-1)[idx], after.reshape(-1)[idx])
    return size * math.sqrt(before.numel() / SAMPLE)


def rel(dtype: torch.dtype) -> float:
    """How close a norm must come to the float64 oracle's: a change is taken in the tensor's
    own dtype, one rounding per element (docs/cost.md, "Cost of observation"), so a 16-bit tensor's
    norm is within its dtype's epsilon; every wider one within 1e-5."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.finfo(dtype).eps
    return 1e-5


def check(mode, probe, ts, before, delta, changed):
    for k, (b, a) in enumerate(zip(before, ts)):
        code = not (a.dtype.is_floating_point or a.dtype.is_complex)  # always fingerprinted
        snap = (mode == "exact" or a.numel() <= SAMPLE) and not code
        want_changed, want_delta = oracle_change(b, a)
        if not snap:
            want_changed = bits_differ(b, a)
        assert changed[k] == want_changed, (mode, k, b, a)
        if mode == "off":
            assert math.isnan(delta[k]), (mode, k)  # changed only: no norm is taken
        elif mode == "exact" and code:  # an unchanged print: 0; a changed one: not measured
            assert delta[k] == 0.0 if not want_changed else math.isnan(delta[k]), (k, b, a)
        elif snap:
            if math.isinf(want_delta) or want_delta == 0:
                assert delta[k] == want_delta, (mode, k, b, a, delta[k])
            else:
                assert delta[k] == pytest.approx(want_delta, rel=rel(a.dtype)), (mode, k, b, a)
        elif not a.dtype.is_floating_point:
            assert math.isnan(delta[k]), (mode, k)
        elif not want_changed:
            assert delta[k] == 0.0
        else:
            est = sample_estimate(probe, k, b, a)
            if est == 0:
                assert math.isnan(delta[k]), (k, b, a)  # the change missed the sample
            elif math.isinf(est):
                assert delta[k] == est
            else:
                assert delta[k] == pytest.approx(est, rel=rel(a.dtype)), (k, b, a)


@pytest.mark.parametrize("mode", ["exact", "sampled", "off"])
@ORACLE
@given(data=st.data())
def test_probe_agrees_with_the_oracle(mode, data):
    oracle_steps(mode, data)


@ORACLE
@given(data=st.data())
def test_exact_probe_agrees_chunk_by_chunk(data):
    """The same oracle with `snapshot_pass` cutting tensors into chunks of 2 elements, so a
    tensor's rare chunks (NaN, inf, underflow) sit beside ordinary ones and are decided one
    by one: the whole tensor's answer must not change."""
    from diagkit.measure.change import snapshot_pass
    was = snapshot_pass.CHUNK
    snapshot_pass.CHUNK = 2
    try:
        oracle_steps("exact", data)
    finally:
        snapshot_pass.CHUNK = was


def oracle_steps(mode, data):
    """A few observed steps of random edits on random tensors, each checked by the oracle."""
    ts = data.draw(st.lists(tensors(), min_size=1, max_size=4))
    if data.draw(st.booleans()):  # a twin of the first: the bucketed (grouped) path
        ts.append(ts[0].clone())
    probe = make_probe(mode, ts, likely_static=set(data.draw(
        st.sets(st.integers(0, len(ts) - 1)))), sample=SAMPLE)
    probe.attach()
    try:
        for step in range(data.draw(st.integers(1, 3))):
            gap = data.draw(st.booleans()) and step > 0
            if gap:  # values changed while unobserved: the next begin is not consecutive
                with torch.no_grad():
                    apply(ts, data.draw(edits(ts)))
            before, delta, changed = run_step(probe, ts, data.draw(edits(ts)),
                                              consecutive=step > 0 and not gap)
            check(mode, probe, ts, before, delta, changed)
    finally:
        probe.detach()


def test_a_tiny_float64_change_is_not_lost_to_underflow():
    """The sampled probe's change norm of float64 samples is scaled before squaring: a change
    of 1e-300 squares to 0 in float64 and read as a change that missed the sample (found by
    the oracle above on a draw of 2.2e-308). Rows of other sizes, and empty rows, still work."""
    from diagkit.measure.change.parts import row_change_norms
    tiny = torch.tensor([[2.2251e-308, 0.0, 0.0, 0.0], [1e-300, 3e-300, 0.0, 0.0]],
                        dtype=torch.float64)
    got = row_change_norms(tiny, -tiny)
    want = [oracle_change(b, a)[1] for b, a in zip(tiny, -tiny)]
    assert got.tolist() == pytest.approx(want, rel=1e-12, abs=0) and all(w > 0 for w in want)
    big = torch.tensor([[1.5e308, 0.0]], dtype=torch.float64)
    assert row_change_norms(big, -big).tolist() == [math.inf]  # the norm itself overflows
    assert row_change_norms(torch.zeros(2, 0), torch.zeros(2, 0)).tolist() == [0.0, 0.0]
