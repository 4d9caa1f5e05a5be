"""Small tensors of one shape, dtype and device grouped, so per-tensor work runs as one kernel
per group (`Buckets`), and the positions of a list of tensors laid out over those groups
(`Layout`). Used for gradient norms and for the exact probe's snapshots.

A tensor on the meta device has a shape but no values: it is never grouped, and a `Layout`
never measures it (`unmeasured`), so its gradient norm stays NaN, not measured, and never
reaches the rare path that looks at values (`step.fresh_norms.resolve_fresh`)."""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from .kernels import norms, row_norms


class Buckets:
    """Small tensors of one shape, dtype and device, grouped so per-tensor work runs as one
    kernel per group.

    A foreach kernel still pays a fixed cost per tensor on the CPU, which dominated observing
    models of many small tensors (`benchmarks/README.md`). A group is stacked into one
    (count, *shape) matrix (a persistent buffer or a reused scratch buffer of at most
    BUCKET_MAX elements), whose row norms take one kernel.
    """

    TENSOR_MAX = 1 << 16   # elements: larger tensors amortise their own kernel launch
    BUCKET_MAX = 1 << 20   # elements per group: bounds the scratch buffer (4 MiB in float32)

    def __init__(self, tensors: list[torch.Tensor], candidates=None):
        shared: dict[tuple, list[int]] = {}
        self.unmeasured: set[int] = set()  # on meta: no values to measure
        for k in (range(len(tensors)) if candidates is None else candidates):
            t = tensors[k]
            if t.is_meta:
                self.unmeasured.add(k)
            elif t.is_floating_point() and not t.is_sparse and 0 < t.numel() <= self.TENSOR_MAX:
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
    call each (`itemgetter`) instead of a Python loop per tensor. The buckets' `unmeasured`
    tensors (on meta) are in neither: their values are never read."""

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
        skip = grouped | buckets.unmeasured
        self.loose = [p for p, k in enumerate(ks) if k not in skip]

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
