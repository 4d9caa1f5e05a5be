"""Batched device arithmetic behind the recorder (no hooks here).

Everything returns 0-d device tensors, never Python numbers, so a step's measurements can be
read back to the host in one transfer per device (`readback`). The choice of kernels comes
from the profile in `benchmarks/README.md`: an L2 norm is one fast vectorised pass, while an
infinity norm (`ord=inf`) was 20x slower on CPU, so exact zero checks use `aminmax` and run
only on the few tensors that need them.
"""

from __future__ import annotations

import math
import operator

import numpy as np
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


# ------------------------------------------------------------------ buckets
class Buckets:
    """Small tensors of one shape, dtype and device, grouped so per-tensor work runs as one
    kernel per group.

    On CPU a foreach kernel still pays ~1.5 us per tensor; a model of 500 small tensors spent
    most of its observation time there. A group is stacked into one (count, *shape) matrix
    (a persistent buffer or a reused scratch buffer of at most BUCKET_MAX elements), whose
    row norms take one kernel.
    """

    TENSOR_MAX = 1 << 16   # elements: larger tensors amortise their own kernel launch
    BUCKET_MAX = 1 << 20   # elements per group: bounds the scratch buffer (4 MiB in float32)

    def __init__(self, tensors: list[torch.Tensor], candidates=None):
        shared: dict[tuple, list[int]] = {}
        for k in (range(len(tensors)) if candidates is None else candidates):
            t = tensors[k]
            if t.is_floating_point() and not t.is_sparse and 0 < t.numel() <= self.TENSOR_MAX:
                shared.setdefault((t.device, t.dtype, tuple(t.shape)), []).append(k)
        self.groups: list[tuple[tuple, list[int]]] = []
        for key, ks in shared.items():
            per = max(1, self.BUCKET_MAX // max(1, tensors[ks[0]].numel()))
            for i in range(0, len(ks), per):
                if len(ks[i:i + per]) >= 2:
                    self.groups.append((key, ks[i:i + per]))
        self._scratch: dict[tuple, torch.Tensor] = {}

    def matrix(self, g: int) -> torch.Tensor:
        (device, dtype, shape), ks = self.groups[g]
        return torch.empty((len(ks), *shape), dtype=dtype, device=device)

    def stacked(self, g: int, members: list[torch.Tensor]) -> torch.Tensor:
        """`members` stacked into the reused scratch buffer (valid until the next call)."""
        (device, dtype, shape), ks = self.groups[g]
        size = len(ks) * math.prod(shape)
        buf = self._scratch.get((device, dtype))
        if buf is None or buf.numel() < size:
            buf = torch.empty(max(size, min(self.BUCKET_MAX, 1 << 16)), dtype=dtype,
                              device=device)
            self._scratch[(device, dtype)] = buf
        out = buf[:size].view(len(ks), *shape)
        torch.stack(members, out=out)
        return out

    def clear(self) -> None:
        self._scratch.clear()


class Layout:
    """Tensors `ks` at fixed positions of a list, with the groups of `buckets` that lie wholly
    among them, so a step's values (e.g. every `.grad`) are fetched group by group in one C
    call each (`itemgetter`) instead of a Python loop per tensor."""

    def __init__(self, ks: list[int], buckets: Buckets):
        self.ks = ks
        self.pos = {k: p for p, k in enumerate(ks)}
        self.buckets = buckets
        self.groups = []
        grouped = set()
        for g, (_, gks) in enumerate(buckets.groups):
            if all(k in self.pos for k in gks):
                self.groups.append((g, np.array(gks, dtype=np.int64),
                                    operator.itemgetter(*[self.pos[k] for k in gks])))
                grouped.update(gks)
        self.loose = [p for p, k in enumerate(ks) if k not in grouped]

    def get(self, values: list, k: int):
        """Tensor k's value in `values`, None if it has none there."""
        p = self.pos.get(k)
        return None if p is None else values[p]

    def norms(self, values: list) -> list[tuple[object, object]]:
        """L2 norms of the values present (None: absent): [(ks, 1-D tensor or list of 0-d
        tensors)], ks an index array or list.

        A group with a member absent (TypeError) or sparse (RuntimeError) goes one by one.
        """
        out, loose = [], self.loose
        for g, gks, getter in self.groups:
            try:
                out.append((gks, row_norms(self.buckets.stacked(g, list(getter(values))))))
            except (RuntimeError, TypeError):
                loose = loose + [self.pos[k] for k in gks.tolist()]
        loose = [p for p in loose if values[p] is not None]
        if loose:
            out.append(([self.ks[p] for p in loose], norms([values[p] for p in loose])))
        return out


def row_norms(matrix: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(matrix.reshape(len(matrix), -1), dim=1, dtype=torch.float32)


# ------------------------------------------------------------------ fingerprints
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}


class Fingerprinter:
    """Two 32-bit integer sums over a tensor's raw bits: a plain one and a position-weighted one.

    Changed/unchanged without a copy of the tensor: a change of any single element always
    changes the plain sum (integer addition mod 2^32 loses nothing of a 32-bit difference), and
    several changes that cancel in both sums have a chance of about 2^-64. Integer sums do not
    depend on summation order, so the result is the same on every device and thread count.
    Work is chunked so the extra memory is two chunk-sized buffers per device, whatever the
    tensor's size. Comparison is bitwise: +0.0 -> -0.0 counts as a change.
    """

    CHUNK = 1 << 20

    def __init__(self):
        self._weights: dict[torch.device, torch.Tensor] = {}
        self._scratch: dict[torch.device, torch.Tensor] = {}

    def _buffers(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._weights:
            gen = torch.Generator().manual_seed(0x5EED)  # never the global RNG
            w = torch.randint(-2**31, 2**31 - 1, (self.CHUNK,), generator=gen,
                              dtype=torch.int32).bitwise_or_(1)
            self._weights[device] = w.to(device)
            self._scratch[device] = torch.empty(self.CHUNK, dtype=torch.int32, device=device)
        return self._weights[device], self._scratch[device]

    def __call__(self, t: torch.Tensor) -> list[torch.Tensor]:
        t = dense(t.detach())
        if not t.is_contiguous():
            t = t.contiguous()  # rare for parameters: a temporary copy
        device = t.device
        if t.numel() == 0:
            zero = torch.zeros((), dtype=torch.int32, device=device)
            return [zero, zero]
        flat = t.reshape(-1).view(_INT_VIEW.get(t.element_size(), torch.uint8))
        weights, scratch = self._buffers(device)
        plain = torch.zeros((), dtype=torch.int32, device=device)
        placed = torch.zeros((), dtype=torch.int32, device=device)
        for start in range(0, flat.numel(), self.CHUNK):
            chunk = flat[start:start + self.CHUNK]
            n = chunk.numel()
            plain += chunk.sum(dtype=torch.int32)
            torch.mul(chunk, weights[:n], out=scratch[:n])
            # Which chunk a value sits in matters too: fold the chunk number in.
            placed += scratch[:n].sum(dtype=torch.int32) * (2 * (start // self.CHUNK) + 1)
        return [plain, placed]

    def clear(self) -> None:
        self._weights.clear()
        self._scratch.clear()


# ------------------------------------------------------------------ read-back
class Pending:
    """Named measurements, read back to the host together: one transfer per device and dtype.

    A measurement is added as a list of 0-d device tensors (what foreach kernels return) or
    as 1-D tensors holding one value per tensor (a bucketed kernel); a name may get several.
    Kept lean: it runs once per observed step, when the CPU's caches are cold from the step's
    own kernels and every Python operation costs several times its warm price.
    """

    def __init__(self):
        self._pieces: list[torch.Tensor] = []
        self._owner: list[str] = []           # the name of each piece
        self._names: dict[str, None] = {}     # every name added, even with nothing

    def add(self, name: str, values) -> None:
        """`values`: a list of 0-d tensors (foreach results) or one 1-D tensor (row norms)."""
        self._names[name] = None
        if isinstance(values, torch.Tensor):
            self._pieces.append(values.reshape(-1))
            self._owner.append(name)
        elif values:
            chunk = _one_dimensional(list(values))
            self._pieces += chunk
            self._owner += [name] * len(chunk)

    def read(self) -> dict[str, np.ndarray]:
        out = readback(self._pieces)
        spans: dict[str, list[tuple[int, int]]] = {}
        at = 0
        for name, piece in zip(self._owner, self._pieces):
            size = piece.numel()
            spans.setdefault(name, []).append((at, at + size))
            at += size
        got = {}
        for name in self._names:
            parts = spans.get(name)
            if not parts:
                got[name] = out[:0]
            elif len(parts) == 1 or all(b == c for (_, b), (c, _) in zip(parts, parts[1:])):
                got[name] = out[parts[0][0]:parts[-1][1]]  # contiguous: a view
            else:
                got[name] = np.concatenate([out[a:b] for a, b in parts])
        return got


def _one_dimensional(chunk: list) -> list[torch.Tensor]:
    if len(chunk) == 1:
        return [chunk[0].reshape(1)]
    try:
        return [torch.stack(chunk)]
    except RuntimeError:  # scalars on several devices (or dtypes): keep them apart
        return [v.reshape(1) for v in chunk]


def readback(pieces: list[torch.Tensor]) -> np.ndarray:
    """Concatenate 1-D device tensors on the host: one transfer per device.

    Mixed dtypes on one device (float32 norms, int32 fingerprints) are widened to float64
    there first, which is exact for both.
    """
    if not pieces:
        return np.empty(0, dtype=np.float64)
    groups: dict[torch.device, list[int]] = {}
    for i, p in enumerate(pieces):
        groups.setdefault(p.device, []).append(i)
    if len(groups) == 1:
        return _to_host(pieces)
    sizes = np.array([p.numel() for p in pieces], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out = np.empty(int(starts[-1]), dtype=np.float64)
    for idx in groups.values():
        at = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in idx])
        out[at] = _to_host([pieces[i] for i in idx])
    return out


def _to_host(pieces: list[torch.Tensor]) -> np.ndarray:
    if len({p.dtype for p in pieces}) > 1:
        pieces = [p.to(torch.float64) for p in pieces]
    return torch.cat(pieces).cpu().numpy().astype(np.float64)
