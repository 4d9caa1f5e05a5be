"""Changed or unchanged without a copy: an integer fingerprint of a tensor's bits.

What it can and cannot miss is stated in docs/cost.md, "Cost of observation"; `Fingerprinter`
gives the reasoning.
"""

from __future__ import annotations

import numpy as np
import torch

from .kernels import dense

P = 67108859    # the largest prime below 2^26: every word difference (|d| < 2^16) is invertible
HASHES = 3      # independent hashes mod P
SEED = 0x5EED   # fixed weights: the same fingerprint on every run, device and thread count


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

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """The fingerprint: a 1-D int64 tensor (the lane sums, then the hashes) on t's device."""
        t = dense(t.detach())
        if not t.is_contiguous():
            t = t.contiguous()  # rare for parameters: a temporary copy
        flat = t.reshape(-1)
        words = flat.view(torch.int16) if t.element_size() >= 2 else flat.view(torch.uint8)
        lanes = max(1, t.element_size() // words.element_size())
        if words.device.type == "mps":  # no float64 there: the exact sums run on the host
            words = words.cpu()
        if words.device.type != "cpu":
            return self._sums(words, lanes)
        # One thread: the products are memory-bound, and BLAS threads on a busy CPU wait on
        # each other for milliseconds a call (seen: 36 ms for a 1 x 2048 product, 6 us alone).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._sums(words, lanes).to(t.device)
        finally:
            torch.set_num_threads(threads)

    def _sums(self, words: torch.Tensor, lanes: int) -> torch.Tensor:
        """Per chunk only a copy into float64 and one matrix product (both memory-bound, and
        the scratch stays in cache); the modular arithmetic runs on GROUP chunks' row sums at
        once, in int64, where products of two residues stay below 2^52."""
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
        for g0 in range(0, chunks, self.GROUP):
            g1 = min(chunks, g0 + self.GROUP)
            for c in range(g0, min(g1, full)):  # the loop that matters: two kernels a chunk
                scratch.copy_(whole[c])
                mm(square, cols, slots[c - g0])
            if g1 > full:  # the last chunk, short: its last row padded with zero words
                k = n - full * per
                used = -(-k // width)
                scratch[k:used * width].zero_()
                scratch[:k].copy_(words[full * per:])
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


def _product(device: torch.device):
    """`out <- a @ b` for a chunk's row sums. On the CPU through numpy (views of the same
    memory): this skinny product ((64, 2048) x (2048, 5) in float64) takes ~170 us in torch's
    BLAS and ~40 us in numpy's, whatever else the machine runs (benchmarks/README.md, "Issue 25,
    later"). Its inputs are integers and every sum stays below 2^53, so both give the same
    exact numbers."""
    if device.type != "cpu":
        return lambda a, b, out: torch.mm(a, b, out=out)
    return lambda a, b, out: np.dot(a.numpy(), b.numpy(), out=out.numpy())
