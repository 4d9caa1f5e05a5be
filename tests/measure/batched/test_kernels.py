"""The measure layer's device arithmetic, on tiny tensors.

- `kernels`: norms, max_abs, exact_norm (no underflow / overflow), copy_all / sub_all,
  checksum, row_norms.
- `buckets`: which small tensors `Buckets` groups, and `Layout.norms` agreeing with one-by-one
  norms (absent values included).
- `readback.Pending`: empty names, pieces concatenated in order, mixed dtypes read back exactly.
- `fingerprint.Fingerprinter`: equal values give equal prints, any single-element change (also
  past the first chunk, and +0.0 -> -0.0) gives a different one, and so do the structured
  edits that cancelled in the old 32-bit sums (sign flips in pairs, a float64's 2^31 change).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diagkit.measure.batched import kernels
from diagkit.measure.batched.buckets import Buckets, Layout
from diagkit.measure.change.fingerprint import Fingerprinter
from diagkit.measure.batched.readback import Pending, readback


def vnorm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.double()))


# ----------------------------------------------------------------- kernels
def test_norms_match_vector_norm():
    ts = [torch.tensor([3.0, -4.0]), torch.arange(6, dtype=torch.float64).reshape(2, 3),
          torch.tensor([0.5, 0.25], dtype=torch.float16), torch.zeros(3)]
    got = kernels.norms(ts)
    assert len(got) == len(ts)
    for g, t in zip(got, ts):
        # float64 keeps its own range (1e-50 is no float32 zero); others: float32.
        assert g.dtype == (torch.float64 if t.dtype == torch.float64 else torch.float32)
        assert g.dim() == 0
        assert float(g) == pytest.approx(vnorm(t), rel=1e-6)
    assert kernels.norms([]) == []
    tiny = torch.full((3,), 1e-50, dtype=torch.float64)
    assert float(kernels.norms([tiny])[0]) == pytest.approx(math.sqrt(3) * 1e-50, rel=1e-12)
    z = torch.tensor([3 + 4j, 0j], dtype=torch.complex64)  # magnitudes, not the real parts
    assert float(kernels.norms([z])[0]) == pytest.approx(5.0)
    assert float(kernels.norm(torch.tensor([3, -4]))) == 5.0


def test_max_abs_floats_ints_nan_empty():
    assert float(kernels.max_abs(torch.tensor([1.0, -5.0, 2.0]))) == 5.0
    assert float(kernels.max_abs(torch.tensor([0.0, -0.0]))) == 0.0
    assert math.isnan(float(kernels.max_abs(torch.tensor([1.0, float("nan"), -3.0]))))
    assert float(kernels.max_abs(torch.tensor([1.0, float("-inf")]))) == math.inf
    assert float(kernels.max_abs(torch.empty(0))) == 0.0
    assert float(kernels.max_abs(torch.empty(0, dtype=torch.int64))) == 0.0
    # Integers: the true max |x| (it was 0/1), exact in float64.
    assert float(kernels.max_abs(torch.zeros(3, dtype=torch.int32))) == 0.0
    assert float(kernels.max_abs(torch.tensor([0, -7, 0]))) == 7.0
    assert float(kernels.max_abs(torch.tensor([3, -2**31], dtype=torch.int32))) == 2.0**31
    assert float(kernels.max_abs(torch.tensor([-2**63, 5]))) == 2.0**63
    assert float(kernels.max_abs(torch.tensor([200, 7], dtype=torch.uint8))) == 200.0
    assert float(kernels.max_abs(torch.tensor([False, True]))) == 1.0
    assert float(kernels.max_abs(torch.tensor([2, 9], dtype=torch.uint32))) == 9.0
    assert kernels.max_abs(torch.tensor([0, 2])).dtype == torch.float64
    assert float(kernels.max_abs(torch.tensor([1e300, -1e301], dtype=torch.float64))) == 1e301
    assert float(kernels.max_abs(torch.tensor([3 - 4j]))) == pytest.approx(5.0)


def test_exact_norm_neither_underflows_nor_overflows():
    tiny = torch.full((4,), 1e-30)
    assert float(kernels.norms([tiny])[0]) == 0.0  # the plain float32 norm underflows
    assert kernels.exact_norm(tiny) == pytest.approx(1e-30 * 2, rel=1e-6)
    huge = torch.full((4,), 1e30)
    assert float(kernels.norms([huge])[0]) == math.inf  # ... and overflows
    assert kernels.exact_norm(huge) == pytest.approx(1e30 * 2, rel=1e-6)
    assert kernels.exact_norm(torch.zeros(5)) == 0.0
    assert kernels.exact_norm(torch.tensor([1.0, math.inf])) == math.inf
    assert math.isnan(kernels.exact_norm(torch.tensor([1.0, math.nan])))
    sub = torch.tensor([0.0, float(torch.nextafter(torch.tensor(0.0), torch.tensor(1.0)))])
    assert kernels.exact_norm(sub) == float(sub[1]) > 0  # one subnormal: not 0


def test_copy_all_and_sub_all():
    dst = [torch.zeros(2), torch.zeros(3, dtype=torch.float64)]
    src = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0, 5.0], dtype=torch.float64)]
    kernels.copy_all(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src))
    kernels.sub_all(dst, [torch.tensor([0.5, 0.5]), torch.ones(3, dtype=torch.float64)])
    assert torch.equal(dst[0], torch.tensor([0.5, 1.5]))
    assert torch.equal(dst[1], torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64))
    kernels.copy_all([], [])  # nothing to do
    kernels.sub_all([], [])


def test_checksum_equal_values_equal_and_one_element_change_differs():
    a = torch.tensor([0.5, -1.25, 3.0, 7.0])
    assert float(kernels.checksum(a)) == float(kernels.checksum(a.clone()))
    for i in range(len(a)):
        b = a.clone()
        b[i] = torch.nextafter(b[i], torch.tensor(math.inf))
        assert float(kernels.checksum(b)) != float(kernels.checksum(a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32,
                                   torch.complex64])
def test_checksum_of_a_large_tensor_goes_by_chunks_and_keeps_its_meaning(dtype):
    """Past one chunk, the CPU checksum is the sum plus sqrt(2) x the sum of squares of the
    float64 values (as brute force computes it, to rounding), equal for equal values whatever
    the tensor's layout, and a one-ulp change anywhere (first chunk, a chunk boundary, the
    tail) changes it."""
    n = 3 * kernels.CHECKSUM_CHUNK + 15
    torch.manual_seed(0)
    a = (torch.randn(n, dtype=torch.float64) * 100).to(dtype) if not dtype.is_complex \
        else torch.randn(n, dtype=dtype)
    x = torch.view_as_real(a).double() if dtype.is_complex else a.double()
    brute = float(x.sum()) + float((x * x).sum()) * math.sqrt(2.0)
    got = float(kernels.checksum(a))
    assert got == pytest.approx(brute, rel=1e-12)
    assert float(kernels.checksum(a.clone().reshape(3, -1))) == got
    assert float(kernels.checksum(torch.cat([a, a])[n:])) == got  # an offset view
    if dtype not in (torch.float32, torch.bfloat16):  # float64: a 1-ulp change is below
        return                                         # a float64 total's own rounding
    for i in (0, kernels.CHECKSUM_CHUNK - 1, kernels.CHECKSUM_CHUNK, n - 1):
        b = a.clone()
        b[i] = torch.nextafter(b[i:i + 1].float(), torch.tensor([math.inf])).to(dtype) \
            if dtype == torch.float32 else b[i] * (1 + 2**-7)
        assert not torch.equal(a, b)
        assert float(kernels.checksum(b)) != got, i


def test_row_norms():
    m = torch.tensor([[[3.0, 4.0]], [[0.0, 0.0]], [[1.0, 1.0]]])
    got = kernels.row_norms(m)
    assert got.shape == (3,) and got.dtype == torch.float32
    assert got.tolist() == pytest.approx([5.0, 0.0, math.sqrt(2)])
    # float64 (it raised: vector_norm refuses to narrow a double to float32).
    got = kernels.row_norms(m.double() * 1e-100)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx([5e-100, 0.0, math.sqrt(2) * 1e-100])
    assert kernels.row_norms(m.half()).tolist() == pytest.approx([5.0, 0.0, math.sqrt(2)])


# ----------------------------------------------------------------- buckets
def test_buckets_group_same_shape_small_float_tensors():
    ts = [torch.ones(3), torch.ones(2, 2), torch.ones(3), torch.ones(3, dtype=torch.int64),
          torch.ones(3), torch.ones(5), torch.ones(2, 2), torch.ones(3, dtype=torch.float64),
          torch.ones(Buckets.TENSOR_MAX + 1), torch.ones(Buckets.TENSOR_MAX + 1), torch.ones(0),
          torch.ones(0)]
    groups = {key: ks for key, ks in Buckets(ts).groups}
    cpu = torch.device("cpu")
    assert groups == {(cpu, torch.float32, (3,)): [0, 2, 4],
                      (cpu, torch.float32, (2, 2)): [1, 6]}
    assert Buckets(ts, candidates=[0, 1, 2]).groups == [((cpu, torch.float32, (3,)), [0, 2])]


def test_buckets_split_at_bucket_max_and_drop_singletons(monkeypatch):
    monkeypatch.setattr(Buckets, "BUCKET_MAX", 6)  # two tensors of 3 per group
    ts = [torch.ones(3) for _ in range(5)]
    assert [ks for _, ks in Buckets(ts).groups] == [[0, 1], [2, 3]]  # [4] alone: no group


def test_buckets_stacked_and_matrix():
    ts = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    b = Buckets(ts)
    assert b.matrix(0).shape == (2, 2)
    assert torch.equal(b.stacked(0, ts), torch.stack(ts))
    b.clear()


def _as_dict(parts) -> dict[int, float]:
    out = {}
    for ks, vals in parts:
        vals = vals.tolist() if isinstance(vals, torch.Tensor) else [float(v) for v in vals]
        ks = ks.tolist() if isinstance(ks, np.ndarray) else list(ks)
        assert len(ks) == len(vals)
        out.update(zip(ks, vals))
    return out


def test_layout_norms_match_one_by_one_with_absent_values():
    torch.manual_seed(0)
    ts = [torch.randn(3), torch.randn(3), torch.randn(2, 2), torch.randn(3), torch.randn(5)]
    buckets = Buckets(ts)
    assert [ks for _, ks in buckets.groups] == [[0, 1, 3]]
    layout = Layout([0, 1, 2, 3, 4], buckets)
    assert len(layout.groups) == 1 and layout.loose == [2, 4]
    full = _as_dict(layout.norms(ts))
    assert full == pytest.approx({k: vnorm(t) for k, t in enumerate(ts)}, rel=1e-6)
    values = [ts[0], None, ts[2], ts[3], None]  # a grouped member and a loose one absent
    part = _as_dict(layout.norms(values))
    assert part == pytest.approx({0: vnorm(ts[0]), 2: vnorm(ts[2]), 3: vnorm(ts[3])}, rel=1e-6)
    assert layout.get(values, 1) is None and layout.get(values, 3) is ts[3]


def test_layout_over_a_subset_keeps_groups_wholly_inside():
    ts = [torch.ones(3), torch.full((3,), 2.0), torch.full((3,), 3.0)]
    buckets = Buckets(ts)
    sub = Layout([2, 0], buckets)  # group [0, 1, 2] is not wholly inside: all loose
    assert sub.groups == [] and sub.loose == [0, 1]
    assert _as_dict(sub.norms([ts[2], ts[0]])) == pytest.approx(
        {2: vnorm(ts[2]), 0: vnorm(ts[0])})
    assert sub.get([ts[2], ts[0]], 1) is None  # not laid out


# ----------------------------------------------------------------- readback
def test_pending_empty_names_and_order():
    p = Pending()
    p.add("none", [])
    p.add("a", [torch.tensor(1.0), torch.tensor(2.0)])
    p.add("b", torch.tensor([10.0, 20.0, 30.0]))
    p.add("a", torch.tensor([3.0]))  # a second piece, not adjacent to the first
    p.add("a", [torch.tensor(4.0)])
    p.add("b", [])
    got = p.read()
    assert set(got) == {"none", "a", "b"}
    assert got["none"].shape == (0,)
    assert got["a"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert got["b"].tolist() == [10.0, 20.0, 30.0]
    assert Pending().read() == {}


def test_pending_mixed_dtypes_read_back_exactly():
    p = Pending()
    ints = torch.tensor([2**31 - 1, -2**31, 123456789], dtype=torch.int32)
    p.add("i", list(ints))
    p.add("f", [torch.tensor(0.1), torch.tensor(1e-30)])
    p.add("j", [torch.tensor(-2**31 + 1, dtype=torch.int32)])
    got = p.read()
    assert got["i"].tolist() == [2**31 - 1, -2**31, 123456789]
    assert got["j"].tolist() == [-2**31 + 1]
    assert got["f"].tolist() == [float(torch.tensor(0.1)), float(torch.tensor(1e-30))]
    assert readback([]).shape == (0,)


# ----------------------------------------------------------------- fingerprint
def _print(fp: Fingerprinter, t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(v) for v in fp(t))


def _bumped(t: torch.Tensor, i: int) -> torch.Tensor:
    out = t.clone()
    flat = out.view(-1)
    flat[i] = torch.nextafter(flat[i], torch.tensor(math.inf, dtype=t.dtype))
    return out


def test_fingerprint_equal_for_equal_and_single_change_differs():
    fp = Fingerprinter()
    t = torch.linspace(-2.0, 3.0, 12).reshape(3, 4)
    assert _print(fp, t) == _print(fp, t.clone())
    for i in (0, 5, 11):
        assert _print(fp, _bumped(t, i)) != _print(fp, t), i
    swapped = t.clone().view(-1)
    swapped[[0, 1]] = swapped[[1, 0]]
    assert _print(fp, swapped) != _print(fp, t)  # same values, other places
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        d = t.to(dtype)
        assert _print(fp, d) == _print(fp, d.clone())
        assert _print(fp, _bumped(d, 7)) != _print(fp, d), dtype


def test_fingerprint_signed_zero_empty_and_non_contiguous():
    fp = Fingerprinter()
    assert _print(fp, torch.tensor([1.0, 0.0])) != _print(fp, torch.tensor([1.0, -0.0]))
    assert set(_print(fp, torch.empty(0))) == {0}
    m = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert _print(fp, m.t()) == _print(fp, m.t().contiguous())


def test_fingerprint_beyond_one_chunk():
    fp = Fingerprinter()
    n = Fingerprinter.CHUNK // 2 + 5  # float32: two words an element, so two chunks
    t = torch.arange(n, dtype=torch.float32)
    base = _print(fp, t)
    half = Fingerprinter.CHUNK // 2
    for i in (0, half - 1, half, half + 2, n - 1):
        t[i] += 0.5
        assert _print(fp, t) != base, i
        t[i] -= 0.5
    assert _print(fp, t) == base
    # One value moved from the first chunk to the same offset of the second.
    u = torch.zeros(n)
    u[3] = 1.0
    v = torch.zeros(n)
    v[half + 3] = 1.0
    assert _print(fp, u) != _print(fp, v)
    fp.clear()
    assert _print(fp, t) == base  # the same weights again after clear


@pytest.mark.parametrize("chunk", [64, Fingerprinter.CHUNK])
def test_fingerprint_structured_edits_that_cancelled_in_pairs(chunk):
    """Position weights forced odd made a change of 2^31 in two words cancel in both 32-bit
    sums: negating two float32 elements, or a float64's top word, went unseen."""
    fp = Fingerprinter()
    fp.CHUNK = chunk
    t = torch.tensor([1.0, 2.0, 3.0])
    u = t.clone()
    u[:2] *= -1
    assert _print(fp, u) != _print(fp, t)
    w = torch.tensor([1.0, -2.0, 3.0])  # one flip each way: the lane sums cancel too
    x = w.clone()
    x[:2] *= -1
    assert _print(fp, x) != _print(fp, w)
    d = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    e = d.clone()
    e[0] = -1.0000004768371582  # a change of 2^31 in both 32-bit words
    assert _print(fp, e) != _print(fp, d)
    ints = torch.tensor([0, 2**31 - 1, 5], dtype=torch.int32)  # a swap: the lane sums agree
    assert _print(fp, ints[[1, 0, 2]]) != _print(fp, ints)
    big = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    for a, b in ((0, 4999), (17, 2048), (1, 2)):  # sign flips of opposite-signed pairs
        flipped = big.clone()
        flipped[[a, b]] = flipped[[a, b]].abs() * torch.tensor([1.0, -1.0])
        base = flipped.clone()
        flipped[[a, b]] *= -1
        assert _print(fp, flipped) != _print(fp, base), (a, b)
    for bit in (0, 15, 16, 31):  # one bit flipped in two elements, both ways
        raw = big.clone().view(torch.int32)
        raw[3] ^= 1 << bit if bit < 31 else -2**31
        raw[9] ^= 1 << bit if bit < 31 else -2**31
        assert _print(fp, raw.view(torch.float32)) != _print(fp, big), bit


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int8])
def test_fingerprint_on_the_cpu_is_the_exact_one_whichever_blas_sums(dtype, monkeypatch):
    """The CPU's row sums go through numpy's BLAS, elsewhere torch's: with integer inputs and
    sums below 2^53 both are exact, so a print is the same number on every device. Checked
    against torch's product on random bit patterns (whole chunks, a short last chunk, one
    element) and on the extreme word -2^15 everywhere."""
    from diagkit.measure.change import fingerprint

    def bits(n: int, fill: int | None = None) -> torch.Tensor:
        """n elements of `dtype` made of random (or `fill`) 16-bit words, or int8 bytes."""
        size = n * max(1, torch.empty(0, dtype=dtype).element_size() // 2)
        if dtype == torch.int8:
            return torch.randint(-128, 128, (n,), generator=gen, dtype=torch.int8)
        words = (torch.full((size,), fill, dtype=torch.int16) if fill is not None else
                 torch.randint(-2**15, 2**15, (size,), generator=gen, dtype=torch.int16))
        return words.view(dtype)

    gen = torch.Generator().manual_seed(3)
    tensors = [bits(n) for n in (1, Fingerprinter.CHUNK + 17, 2 * Fingerprinter.CHUNK)]
    tensors.append(bits(70_000, fill=-2**15))
    numpy_prints = [_print(Fingerprinter(), t) for t in tensors]
    monkeypatch.setattr(fingerprint, "_product",
                        lambda device: lambda a, b, out: torch.mm(a, b, out=out))
    assert [_print(Fingerprinter(), t) for t in tensors] == numpy_prints
