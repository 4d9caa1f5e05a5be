"""Changed or unchanged without a copy: an integer fingerprint of a tensor's bits (or of a float
tensor's values), and `Prints`, the fingerprints of a set of tensors step by step.

What it can and cannot miss is stated in docs/cost.md, "Cost of observation"; `Fingerprinter`
gives the reasoning.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..batched.kernels import dense, is_float
from ..batched.readback import Pending

P = 67108859    # the largest prime below 2^26: every word difference (|d| < 2^16) is invertible
HASHES = 3      # independent hashes mod P
SEED = 0x5EED   # fixed weights: the same fingerprint on every run, device and thread count


def stored_as_code(t: torch.Tensor) -> bool:
    """Integer and quantised storage (integers, bool, float8 and the like): what holds codes,
    not values a snapshot-and-subtract measures. Always fingerprinted, in every mode, never
    compared element by element on each step (docs/cost.md, "Cost of observation"); complex
    tensors are values, and stay where their mode puts them."""
    return not is_float(t) and not t.is_complex()


class Fingerprinter:
    """A tensor's bits as 16-bit words (bytes for 1-byte dtypes), summed two ways.

    - Lane sums: the words at each position within an element (a float32 has 2 lanes, a
      float64 4) summed exactly. A change of any single element changes one of its words,
      hence that lane's sum: it is never missed. Nor is any edit whose word differences do not
      cancel lane by lane (negating several positive elements, say).
    - HASHES universal hashes mod the prime P: the sum over words of x * r_c * v_i * w_j (c the
      chunk, i the row within it, j the column), with r, v, w drawn once from a seeded
      generator. For any nonzero difference that sum is a nonzero polynomial of degree 3 in
      the weights (a word difference is below 2^16 < P, never 0 mod P), which vanishes for at
      most 3/P of the weights (Schwartz-Zippel). So an edit whose lane sums cancel is missed
      with probability at most (3/P)^3 < 2^-73, whatever its structure (sign flips in pairs,
      swaps, bit flips, 2^31 differences), for any edit not built from the seed.

    The row sums are one float64 matrix product per chunk: its inputs are integers and every
    partial sum stays below 2^53, so it is exact in any summation order (BLAS, GPU) and the
    result is the same on every device and thread count. Work goes in chunks of CHUNK words:
    the extra memory is CHUNK x 8 bytes of scratch, small weight tables and 24 bytes per chunk
    of the largest tensor, per device. Comparison is bitwise: +0.0 -> -0.0 and a change of a
    NaN's payload count as changes.
    """

    ROW = 2048        # words per row: |word| <= 2^15, weights < 2^26, so row sums < 2^52
    CHUNK = 1 << 17   # words per pass: a 1 MiB float64 scratch, close to the cache
    GROUP = 64        # chunks whose row sums are reduced together

    def __init__(self):
        self._weights: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._chunks: dict[torch.device, torch.Tensor] = {}
        self._scratch: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _row_weights(self, device, width: int, rows: int, lanes: int):
        """(width, HASHES + lanes) float64 column weights (then each lane's 0/1 indicator)
        and (rows, HASHES) int64 row weights, on `device`."""
        key = (device, width, rows, lanes)
        if key not in self._weights:
            gen = torch.Generator().manual_seed(SEED)  # never the global RNG
            w = torch.randint(0, P, (width, HASHES), generator=gen, dtype=torch.int64)
            v = torch.randint(0, P, (rows, HASHES), generator=gen, dtype=torch.int64)
            lane = torch.arange(width) % lanes == torch.arange(lanes)[:, None]
            cols = torch.cat([w.double(), lane.t().double()], dim=1)
            self._weights[key] = (cols.to(device), v.to(device))
        return self._weights[key]

    def _chunk_weights(self, device, n: int) -> torch.Tensor:
        """(n, HASHES) chunk weights, drawn in blocks from seeds of their own (the values do
        not depend on which size was asked for first)."""
        have = self._chunks.get(device)
        if have is None or len(have) < n:
            blocks = [torch.randint(0, P, (1024, HASHES), dtype=torch.int64,
                                    generator=torch.Generator().manual_seed(SEED + 1 + b))
                      for b in range((n + 1023) // 1024)]
            self._chunks[device] = have = torch.cat(blocks).to(device)
        return have

    def __call__(self, t: torch.Tensor, values: bool = False) -> torch.Tensor:
        """The fingerprint: a 1-D int64 tensor (the lane sums, then the hashes) on t's device.
        `values`: a float tensor's values, not its bits (`canonical`): -0.0 prints as +0.0 and
        every NaN as one NaN, so the print changes exactly when a snapshot's comparison would."""
        t = dense(t.detach())
        if not t.is_contiguous():
            t = t.contiguous()  # rare for parameters: a temporary copy
        flat = t.reshape(-1)
        if flat.numel() and flat.stride(0) != 1:  # one element, strided: contiguous by torch
            flat = flat.clone(memory_format=torch.contiguous_format)
        words = flat.view(torch.int16) if t.element_size() >= 2 else flat.view(torch.uint8)
        lanes = max(1, t.element_size() // words.element_size())
        if words.device.type == "mps":  # no float64 there: the exact sums run on the host
            words = words.cpu()
        dtype = t.dtype if values and is_float(t) else None
        if words.device.type != "cpu":
            return self._sums(words, lanes, dtype)
        # One thread: the products are memory-bound, and BLAS threads on a busy CPU wait on
        # each other for milliseconds a call (seen: 36 ms for a 1 x 2048 product, 6 us alone).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._sums(words, lanes, dtype).to(t.device)
        finally:
            torch.set_num_threads(threads)

    def _sums(self, words: torch.Tensor, lanes: int, dtype=None) -> torch.Tensor:
        """Per chunk only a copy into float64 and one matrix product (both memory-bound, and
        the scratch stays in cache); the modular arithmetic runs on GROUP chunks' row sums at
        once, in int64, where products of two residues stay below 2^52. `dtype`: the float
        dtype whose values are printed (`canonical`, chunk by chunk), else None: the bits."""
        device, n = words.device, words.numel()
        if n == 0:
            return torch.zeros(lanes + HASHES, dtype=torch.int64, device=device)
        width = max(lanes, min(self.ROW, self.CHUNK) // lanes * lanes)
        rows = max(1, self.CHUNK // width)
        per, chunks = rows * width, -(-n // (rows * width))
        cols, v = self._row_weights(device, width, rows, lanes)
        r = self._chunk_weights(device, chunks)
        scratch, table = self._buffers(device, per, rows * self.GROUP, cols.shape[1])
        hashes = torch.zeros(HASHES, dtype=torch.int64, device=device)
        lane_sums = torch.zeros(lanes, dtype=torch.int64, device=device)
        full = n // per
        whole = words[:full * per].view(full, per)
        square, slots = scratch.view(rows, width), table.view(self.GROUP, rows, -1)
        mm = _product(device)
        if dtype is not None:
            canon = canonical(torch.empty(per // lanes, dtype=dtype, device=device))
        else:
            canon = lambda piece: piece  # noqa: E731 (the bits as they are)
        for g0 in range(0, chunks, self.GROUP):
            g1 = min(chunks, g0 + self.GROUP)
            for c in range(g0, min(g1, full)):  # the loop that matters: two kernels a chunk
                scratch.copy_(canon(whole[c]))
                mm(square, cols, slots[c - g0])
            if g1 > full:  # the last chunk, short: its last row padded with zero words
                k = n - full * per
                used = -(-k // width)
                scratch[k:used * width].zero_()
                scratch[:k].copy_(canon(words[full * per:]))
                mm(scratch[:used * width].view(used, width), cols, slots[full - g0, :used])
                slots[full - g0, used:].zero_()
            sums = table[:(g1 - g0) * rows].to(torch.int64)  # exact: integers below 2^53
            lane_sums += sums[:, HASHES:].sum(0)
            h = sums[:, :HASHES].view(g1 - g0, rows, HASHES).remainder_(P).mul_(v)
            h = h.remainder_(P).sum(1).remainder_(P).mul_(r[g0:g1]).remainder_(P)
            hashes += h.sum(0)
        return torch.cat([lane_sums, hashes.remainder_(P)])

    def _buffers(self, device, per: int, slots: int, ncols: int):
        """A chunk's float64 scratch and a table for GROUP chunks' row sums, reused."""
        have = self._scratch.get(device)
        if have is None or have[0].numel() < per or have[1].shape[0] < slots \
                or have[1].shape[1] != ncols:
            have = (torch.empty(per, dtype=torch.float64, device=device),
                    torch.empty(slots, ncols, dtype=torch.float64, device=device))
            self._scratch[device] = have
        return have[0], have[1][:slots]

    def clear(self) -> None:
        self._weights.clear()
        self._chunks.clear()
        self._scratch.clear()


def canonical(tmp: torch.Tensor):
    """A chunk of float words -> the words of its values with -0.0 as +0.0 (x + 0.0 is +0.0
    for either zero) and every NaN as the one NaN `nan_to_num` writes, through `tmp` (a
    chunk's elements in the float dtype, reused): ~15 us per 64K float32 elements."""
    def canon(piece: torch.Tensor) -> torch.Tensor:
        out = tmp[:piece.numel() * piece.element_size() // tmp.element_size()]
        torch.add(piece.view(tmp.dtype), 0.0, out=out)
        torch.nan_to_num(out, nan=math.nan, posinf=math.inf, neginf=-math.inf, out=out)
        return out.view(piece.dtype)
    return canon


def _product(device: torch.device):
    """`out <- a @ b` for a chunk's row sums. On the CPU through numpy (views of the same
    memory): this skinny product ((64, 2048) x (2048, 5) in float64) takes ~170 us in torch's
    BLAS and ~40 us in numpy's, whatever else the machine runs (benchmarks/README.md, "Issue 25,
    later"). Its inputs are integers and every sum stays below 2^53, so both give the same
    exact numbers."""
    if device.type != "cpu":
        return lambda a, b, out: torch.mm(a, b, out=out)
    return lambda a, b, out: np.dot(a.numpy(), b.numpy(), out=out.numpy())


class Prints:
    """Changed or unchanged, per tensor of `indices`, from their fingerprints before and after
    each observed step: a 1 MiB scratch per device whatever the tensors' size, one read of
    each tensor per observed step (the print taken at a step's end is the next consecutive
    step's before; a step after unobserved ones reads them at its begin too). `values`: print
    float tensors' values, not their bits (`Fingerprinter.__call__`)."""

    def __init__(self, tensors: list[torch.Tensor], indices, values: bool = False):
        self.tensors, self.indices, self.values = tensors, list(indices), values
        self.fingerprint = Fingerprinter()
        self._last: list[torch.Tensor] | None = None
        self._before: list[torch.Tensor] = []
        self._sizes: tuple[list[int], list[int]] = ([], [])

    def _take(self) -> list[torch.Tensor]:
        with torch.no_grad():
            return [self.fingerprint(self.tensors[k], self.values) for k in self.indices]

    def attach(self) -> None:
        """The prints before the first step, taken now: a consecutive first step keeps them."""
        self._last = self._take()

    def begin(self, consecutive: bool = False) -> None:
        """`consecutive`: nothing ran since the last `end()`, so its prints still hold."""
        self._before = self._last if consecutive and self._last is not None else self._take()

    def end(self, pending: Pending, tag: str) -> None:
        """Queue the prints before and after on `pending`, as `{tag}.before` / `{tag}.after`."""
        self._last = self._take()
        pending.add(f"{tag}.before", [])  # the names exist even with no tensor
        pending.add(f"{tag}.after", [])
        for before, after in zip(self._before, self._last):
            pending.add(f"{tag}.before", before)
            pending.add(f"{tag}.after", after)
        self._sizes = ([p.numel() for p in self._before], [p.numel() for p in self._last])

    def changed(self, got: dict, tag: str) -> np.ndarray:
        """Per tensor of `indices`, whether its print after the step differs from before."""
        return prints_differ(got[f"{tag}.before"], got[f"{tag}.after"], *self._sizes)

    def clear(self) -> None:
        self.fingerprint.clear()
        self._last, self._before = None, []


def prints_differ(before: np.ndarray, after: np.ndarray, sizes_before, sizes_after):
    """Per tensor, whether its fingerprint after the step differs from the one before (a
    print's length depends on the dtype: a tensor replaced by one of another dtype differs)."""
    if not len(sizes_before):
        return np.zeros(0, dtype=bool)
    if list(sizes_before) == list(sizes_after):
        if len(set(sizes_before)) == 1:  # the common case: one dtype, one reshape
            return (before != after).reshape(len(sizes_before), -1).any(axis=1)
        at = np.cumsum([0] + list(sizes_before))[:-1]
        return np.logical_or.reduceat(before != after, at)
    out, i, j = [], 0, 0
    for a, b in zip(sizes_before, sizes_after):
        out.append(a != b or bool((before[i:i + a] != after[j:j + b]).any()))
        i, j = i + a, j + b
    return np.array(out, dtype=bool)
