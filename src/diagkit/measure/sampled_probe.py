"""`delta="sampled"` and `delta="off"`: bounded memory, exact `changed` from fingerprints (see
`diagkit.measure.probes` for the protocol every probe follows)."""

from __future__ import annotations

import numpy as np
import torch

from . import kernels
from .change_parts import row_change_norms
from .exact_probe import ExactProbe
from .fingerprint import Fingerprinter
from .readback import Pending


class FingerprintProbe:
    """`sampled` (estimate=True) and `off`: bounded memory, exact `changed`.

    Tensors of at most `sample` elements are snapshotted exactly (cheaper than hashing many
    small tensors one by one); larger ones are fingerprinted, and sampled when estimating.
    """

    def __init__(self, tensors, likely_static: set[int], sample: int, estimate: bool):
        self.tensors = tensors
        self.sample = sample
        self.estimate = estimate
        small = [k for k, t in enumerate(tensors) if t.numel() <= sample]
        self.exact = ExactProbe(tensors, small, likely_static)
        self.big = [k for k, t in enumerate(tensors) if t.numel() > sample]
        self.sampled = [k for k in self.big if estimate and kernels.is_float(tensors[k])]
        self.fingerprint = Fingerprinter()
        self._last: list | None = None
        self.checksum_of: set[int] = set()
        self.checksums: dict[int, torch.Tensor] = {}  # never taken in passing here (`Probe`)

    def attach(self) -> None:
        self.exact.attach()
        gen = torch.Generator().manual_seed(0)  # fixed positions; never the global RNG
        kinds: dict[tuple, list[int]] = {}
        for k in self.sampled:
            kinds.setdefault((self.tensors[k].device, self.tensors[k].dtype), []).append(k)
        self.sampled = [k for ks in kinds.values() for k in ks]  # grouped: one kernel a kind
        self._idx = []
        for k in self.sampled:
            idx = torch.randint(self.tensors[k].numel(), (self.sample,), generator=gen)
            self._idx.append(idx.sort().values.to(self.tensors[k].device))
        # Per kind, the samples before and after the step as rows of two matrices.
        self._kinds = [(torch.empty(len(ks), self.sample, dtype=dtype, device=device),
                        torch.empty(len(ks), self.sample, dtype=dtype, device=device))
                       for (device, dtype), ks in kinds.items()]
        self._s_before = [row for before, _ in self._kinds for row in before]
        self._s_after = [row for _, after in self._kinds for row in after]

    def detach(self) -> None:
        self.exact.detach()
        self._idx = self._s_before = self._s_after = self._kinds = []
        self.fingerprint.clear()
        self._last = None

    def _prints(self) -> list[torch.Tensor]:
        return [self.fingerprint(self.tensors[k]) for k in self.big]

    def _take(self, out: list[torch.Tensor]) -> None:
        for k, idx, buf in zip(self.sampled, self._idx, out):
            torch.take(self.tensors[k].detach(), idx, out=buf)

    def begin(self, consecutive: bool = False) -> None:
        """`consecutive`: nothing ran since the last `end()`, so its fingerprints still hold."""
        self.exact.begin(consecutive)
        with torch.no_grad():
            self._fp_before = self._last if consecutive and self._last is not None \
                else self._prints()
            self._big_norm = kernels.norms([self.tensors[k] for k in self.sampled])
            self._take(self._s_before)

    def end(self, pending: Pending) -> None:
        self.exact.end(pending, "small")
        with torch.no_grad():
            self._last = self._prints()
            self._take(self._s_after)
            pending.add("fp.before", [])  # the names exist even with no large tensor
            pending.add("fp.after", [])
            for before, after in zip(self._fp_before, self._last):
                pending.add("fp.before", before)
                pending.add("fp.after", after)
            self._fp_sizes = ([p.numel() for p in self._fp_before], [p.numel() for p in self._last])
            pending.add("s.l2", [])
            for before, after in self._kinds:
                pending.add("s.l2", row_change_norms(before, after))
            pending.add("s.norm", self._big_norm)

    def resolve(self, got: dict):
        n = len(self.tensors)
        delta, changed, ratio = np.full(n, np.nan), np.zeros(n, dtype=bool), np.full(n, np.nan)
        self.value_norm = np.full(n, np.nan)  # the norm before the step, where measured
        self.exact.resolve_into(got, "small", delta, changed, ratio, self.value_norm)
        if not self.estimate:
            delta[:], ratio[:] = np.nan, np.nan
        big = np.array(self.big, dtype=np.int64)
        changed[big] = _prints_differ(got["fp.before"], got["fp.after"], *self._fp_sizes)
        if self.sampled:
            at = np.array(self.sampled, dtype=np.int64)
            numel = np.array([self.tensors[k].numel() for k in self.sampled], dtype=np.float64)
            est = got["s.l2"] * np.sqrt(numel / self.sample)  # inf: a change to or from NaN/inf
            # An unchanged fingerprint: exactly no change. A change the sample missed: unknown.
            est = np.where(changed[at], np.where(est > 0, est, np.nan), 0.0)
            delta[at] = est
            self.value_norm[at] = got["s.norm"]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio[at] = np.where(got["s.norm"] > 0, est / got["s.norm"], np.nan)
        return delta, changed, ratio


def _prints_differ(before: np.ndarray, after: np.ndarray, sizes_before, sizes_after):
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
