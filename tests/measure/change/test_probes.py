"""The delta probes (`make_probe`: exact, sampled, off) driven through their protocol.

attach -> begin -> (tensors modified in place) -> end(pending) -> pending.read() -> resolve
-> detach. Checked: delta_norm against the true change's norm, exact `changed` (one ulp, a
subnormal, an unchanged inf), update_ratio = delta / ||before||, consecutive steps, the
sampled mode's exact `changed` and its estimate, and the off mode's NaN deltas.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diagkit.measure.change.probes import make_probe
from diagkit.measure.batched.readback import Pending

INF = torch.tensor(math.inf)


def one_step(probe, tensors, change, consecutive=False):
    """Run one step of `probe` while `change(tensors)` modifies them; return
    (delta, changed, ratio, true change norms, before norms)."""
    before = [t.clone() for t in tensors]
    probe.begin(consecutive=consecutive)
    with torch.no_grad():
        change(tensors)
    pending = Pending()
    probe.end(pending)
    delta, changed, ratio = probe.resolve(pending.read())
    true = np.array([float(torch.linalg.vector_norm((_wide(t) - _wide(b))))
                     for t, b in zip(tensors, before)])
    base = np.array([float(torch.linalg.vector_norm(_wide(b))) for b in before])
    return delta, changed, ratio, true, base


def _wide(t):
    return torch.view_as_real(t.to(torch.complex128)) if t.is_complex() else t.double()


def small_set():
    torch.manual_seed(0)
    return [torch.randn(3), torch.randn(3), torch.zeros(2, 2), torch.randn(4, 5),
            torch.arange(5), torch.randn(3)]


def bump_some(ts):
    ts[0].add_(0.25)
    ts[2][1, 1] = 3.0           # from zero: update_ratio NaN
    ts[3].mul_(0.5)
    ts[4][2] = 9                # integer tensor


@pytest.fixture
def exact():
    ts = small_set()
    probe = make_probe("exact", ts, likely_static=set())
    probe.attach()
    yield probe, ts
    probe.detach()


def test_exact_delta_changed_ratio(exact):
    probe, ts = exact
    delta, changed, ratio, true, base = one_step(probe, ts, bump_some)
    assert changed.tolist() == [True, False, True, True, True, False]
    floats = [0, 1, 2, 3, 5]
    assert delta[floats] == pytest.approx(true[floats], rel=1e-6)
    assert delta[1] == 0.0 and delta[5] == 0.0
    # An integer tensor is fingerprinted (docs/cost.md): changed, its norm not measured.
    assert math.isnan(delta[4]) and math.isnan(ratio[4])
    expected = np.divide(true, base, out=np.full(len(ts), np.nan), where=base > 0)
    assert ratio[[0, 1, 3, 5]] == pytest.approx(expected[[0, 1, 3, 5]], rel=1e-6)
    assert math.isnan(ratio[2])  # ||before|| == 0


def test_exact_consecutive_steps(exact):
    probe, ts = exact
    for step in range(4):
        def change(ts, step=step):
            ts[step % 3].mul_(1.5)
            ts[3][0, step] += 1.0
        delta, changed, _, true, _ = one_step(probe, ts, change, consecutive=step > 0)
        assert changed.tolist() == (true > 0).tolist()
        assert delta == pytest.approx(true, rel=1e-6)


def test_exact_nothing_changes_then_something(exact):
    probe, ts = exact
    delta, changed, ratio, _, _ = one_step(probe, ts, lambda ts: None)
    assert not changed.any() and (delta == 0).all()
    delta, changed, _, true, _ = one_step(probe, ts, bump_some, consecutive=True)
    assert changed.tolist() == [True, False, True, True, True, False]
    floats = [0, 1, 2, 3, 5]  # 4, an integer tensor: fingerprinted, NaN when changed
    assert delta[floats] == pytest.approx(true[floats], rel=1e-6) and math.isnan(delta[4])


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_a_first_consecutive_step_keeps_the_snapshot_attach_took(mode):
    """Nothing runs between `attach()` and diagnose's first step, so that step's snapshot is
    the one attach took, not a second copy: a change made after attach (which a caller that
    says `consecutive` promises not to make) shows in the first step's delta. Not consecutive,
    the first step takes its own snapshot and sees only its own change."""
    for consecutive in (True, False):
        ts = small_set()
        probe = make_probe(mode, ts, likely_static=set())
        probe.attach()
        with torch.no_grad():
            ts[0].add_(1.0)  # after attach, before the first step
        try:
            delta, changed, *_ = one_step(probe, ts, lambda ts: ts[1].mul_(2.0),
                                          consecutive=consecutive)
        finally:
            probe.detach()
        assert changed.tolist()[:2] == [consecutive, True]
        assert delta[0] == (pytest.approx(math.sqrt(3.0)) if consecutive else 0.0)


@pytest.mark.parametrize("value", [1.0, 1e-30, 0.0, 3e38])
@pytest.mark.parametrize("mode", ["exact", "sampled", "off"])
def test_one_ulp_change_is_a_change(mode, value):
    small, big = torch.full((3,), value), torch.full((40,), value)
    ts = [small, big, small.clone()]  # two same-shape tensors: a bucketed group too
    probe = make_probe(mode, ts, likely_static={1, 2}, sample=8)
    probe.attach()

    def change(ts):
        for t in ts[:2]:
            t[1] = torch.nextafter(t[1], INF)
    delta, changed, _, true, _ = one_step(probe, ts, change)
    probe.detach()
    assert changed.tolist() == [True, True, False]
    if mode == "off":
        assert np.isnan(delta).all()
        return
    assert delta[0] == pytest.approx(true[0], rel=1e-6) and delta[0] > 0  # small: exact
    assert delta[2] == 0.0
    if mode == "exact":
        assert delta[1] == pytest.approx(true[1], rel=1e-6) and delta[1] > 0
    else:  # an estimate from 8 of 40 positions: may miss the one changed element, and
        assert np.isnan(delta[1]) or delta[1] > 0  # is then NaN (unknown), never 0


def test_likely_static_is_only_a_hint():
    ts = [torch.ones(3), torch.ones(3), torch.ones(4)]
    probe = make_probe("exact", ts, likely_static={0, 1, 2})
    probe.attach()
    for step in range(3):
        def change(ts, step=step):
            if step == 1:
                ts[0][0] = 2.0
                ts[2][3] = torch.nextafter(ts[2][3], INF)
        delta, changed, _, true, _ = one_step(probe, ts, change, consecutive=step > 0)
        assert changed.tolist() == (true > 0).tolist()
        assert changed.any() == (step == 1)
        assert delta == pytest.approx(true, rel=1e-6)
    probe.detach()


@pytest.mark.parametrize("mode", ["exact", "sampled", "off"])
def test_unchanged_inf_is_unchanged(mode):
    ts = [torch.tensor([math.inf, 1.0, -math.inf]), torch.tensor([0.0, -math.inf, 2.0, 5.0]),
          torch.tensor([math.inf, 1.0, 2.0])]
    probe = make_probe(mode, ts, likely_static=set(), sample=3)
    probe.attach()
    for step in range(3):  # the first step finds the NaN difference, later ones expect it
        def change(ts, step=step):
            if step == 2:
                ts[2][1] = 7.0  # a finite element of a tensor holding inf
        delta, changed, _, _, _ = one_step(probe, ts, change, consecutive=step > 0)
        assert changed.tolist() == [False, False, step == 2], step
        if mode == "exact":
            assert delta[:2].tolist() == [0.0, 0.0]
            assert delta[2] == pytest.approx(6.0 if step == 2 else 0.0)
    probe.detach()


def test_exact_change_to_and_from_inf():
    ts = [torch.tensor([1.0, 2.0]), torch.tensor([math.inf, 2.0])]
    probe = make_probe("exact", ts, likely_static=set())
    probe.attach()

    def change(ts):
        ts[0][0] = math.inf
        ts[1][0] = 3.0
    delta, changed, _, _, _ = one_step(probe, ts, change)
    probe.detach()
    assert changed.tolist() == [True, True]
    assert delta.tolist() == [math.inf, math.inf]


def test_sampled_small_tensors_are_exact_and_big_changed_exact():
    torch.manual_seed(1)
    ts = [torch.randn(4), torch.randn(50), torch.randn(50), torch.randn(6, 5),
          torch.arange(40)]
    probe = make_probe("sampled", ts, likely_static=set(), sample=8)
    probe.attach()

    def change(ts):
        ts[0][2] += 1.0
        ts[1][37] = torch.nextafter(ts[1][37], INF)
        ts[3].add_(0.125)   # every element by the same amount: the estimate is exact
        ts[4][39] = -1
    delta, changed, ratio, true, base = one_step(probe, ts, change)
    probe.detach()
    assert changed.tolist() == [True, True, False, True, True]
    assert delta[0] == pytest.approx(true[0], rel=1e-6)
    assert ratio[0] == pytest.approx(true[0] / base[0], rel=1e-6)
    assert delta[2] == 0.0  # unchanged fingerprint: exactly no change
    assert delta[3] == pytest.approx(true[3], rel=1e-5)
    assert ratio[3] == pytest.approx(true[3] / base[3], rel=1e-5)


def test_sampled_consecutive_steps():
    ts = [torch.linspace(1.0, 2.0, 20)]
    probe = make_probe("sampled", ts, likely_static=set(), sample=4)
    probe.attach()
    for step in range(4):
        def change(ts, step=step):
            if step % 2:
                ts[0].sub_(0.5)
        delta, changed, _, true, _ = one_step(probe, ts, change, consecutive=step > 0)
        assert changed.tolist() == [bool(step % 2)]
        assert delta[0] == pytest.approx(true[0], rel=1e-5)
    probe.detach()


def test_off_gives_nan_delta_and_exact_changed():
    ts = [torch.ones(3), torch.ones(3), torch.ones(30), torch.ones(30), torch.arange(3)]
    probe = make_probe("off", ts, likely_static=set(), sample=4)
    probe.attach()

    def change(ts):
        ts[0][0] = 2.0
        ts[2][29] = torch.nextafter(ts[2][29], INF)
        ts[4][0] = 5
    delta, changed, ratio, _, _ = one_step(probe, ts, change)
    probe.detach()
    assert changed.tolist() == [True, False, True, False, True]
    assert np.isnan(delta).all() and np.isnan(ratio).all()


def test_signed_zero_is_a_change_in_fingerprints():
    ts = [torch.zeros(10)]
    probe = make_probe("off", ts, likely_static={0}, sample=2)
    probe.attach()
    _, changed, _, _, _ = one_step(probe, ts, lambda ts: ts[0].__setitem__(4, -0.0))
    probe.detach()
    assert changed.tolist() == [True]


def test_bad_mode_raises():
    with pytest.raises(ValueError, match="delta"):
        make_probe("approximate", [torch.ones(2)], set())


# ------------------------------------------------- the exactness holes of issue 21
@pytest.mark.parametrize("mode", ["exact", "sampled", "off"])
def test_negating_two_elements_is_a_change(mode):
    """The old fingerprint's odd weights cancelled a change of 2^31 in two words."""
    ts = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)]
    probe = make_probe(mode, ts, likely_static=set(), sample=2)
    probe.attach()

    def change(ts):
        ts[0][:2] *= -1
        ts[1][0] = -1.0000004768371582  # 2^31 in both 32-bit words of a float64
    _, changed, _, _, _ = one_step(probe, ts, change)
    probe.detach()
    assert changed.tolist() == [True, True]


NAN = math.nan


@pytest.mark.parametrize("mode", ["exact", "sampled", "off"])
@pytest.mark.parametrize("before, after, expected", [
    ([NAN, 1.0], [NAN, NAN], True),    # a NaN appears where one already was elsewhere
    ([NAN, 1.0], [1.0, 1.0], True),    # the NaN goes away
    ([NAN, 1.0], [NAN, 1.0], False),   # NaN stays NaN: unchanged
    ([1.0, 2.0], [NAN, 2.0], True),
    ([NAN, math.inf], [NAN, math.inf], False),
    ([NAN, 5.0], [math.inf, 5.0], True),
])
def test_nan_before_the_step_hides_no_change(mode, before, after, expected):
    """Once a tensor held NaN, a difference producing NaN anywhere counted as unchanged."""
    for sample in (2, 1):  # a snapshot (<= sample elements), then a fingerprint
        ts = [torch.tensor(before)]
        probe = make_probe(mode, ts, likely_static=set(), sample=sample)
        probe.attach()
        for step in range(2):  # the first step after attach, then a consecutive one
            delta, changed, _, _, _ = one_step(
                probe, ts, lambda ts: ts[0].copy_(torch.tensor(after if step == 0 else before)),
                consecutive=step > 0)
            assert changed.tolist() == [expected], (step, sample)
            if mode == "off" or sample == 1:
                continue
            # 0 only when unchanged; a change to or from NaN or inf has no finite size.
            assert delta.tolist() == [math.inf if expected else 0.0], step
        probe.detach()


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_change_that_overflows_the_dtype_is_measured(mode):
    ts = [torch.tensor([3e38, 1.0]), torch.tensor([6e4, 1.0], dtype=torch.float16),
          torch.tensor([1e308, 0.0, 1e300], dtype=torch.float64)]
    probe = make_probe(mode, ts, likely_static=set(), sample=8)
    probe.attach()

    def change(ts):
        ts[0][0] = -3e38
        ts[1][0] = -6e4
        ts[2][0] = -5e307  # squares past float64's range, the norm within it
    delta, changed, _, _, _ = one_step(probe, ts, change)
    probe.detach()
    assert changed.tolist() == [True, True, True]
    assert delta == pytest.approx([6e38, 12e4, 1.5e308], rel=1e-6)  # it was inf


@pytest.mark.parametrize("mode", ["exact", "sampled", "off"])
def test_every_dtype_is_measured(mode):
    ts = [torch.arange(6, dtype=torch.float64).reshape(2, 3),
          torch.arange(6, dtype=torch.float64).reshape(2, 3) + 1,  # a float64 group
          torch.tensor([1, 2, 3]), torch.tensor([True, False]),
          torch.tensor([1 + 1j, 2j]), torch.tensor([0.5, 1.0], dtype=torch.bfloat16)]
    probe = make_probe(mode, ts, likely_static=set(), sample=8)
    probe.attach()

    def change(ts):
        ts[0][1, 2] = 1e-300  # below float32's range: no underflow to 0
        ts[2][0] = -4
        ts[3][1] = True
        ts[4][1] = 2 + 2j
    delta, changed, ratio, true, base = one_step(probe, ts, change)
    probe.detach()
    assert changed.tolist() == [True, False, True, True, True, False]
    if mode == "off":
        assert np.isnan(delta).all()
        return
    complex_change = abs((2 + 2j) - 2j)
    floats = [0, 1, 4, 5]  # 2 and 3, integer and bool: fingerprinted, changed, no norm
    assert delta[floats] == pytest.approx([true[0], 0.0, complex_change, 0.0], rel=1e-6)
    assert np.isnan(delta[[2, 3]]).all() and np.isnan(ratio[[2, 3]]).all()
