"""`delta="sampled"` and `delta="off"`: bounded memory, exact `changed` from fingerprints (see
`diagkit.measure.probes` for the protocol every probe follows)."""

from __future__ import annotations

import numpy as np
import torch

from . import kernels
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
        self.sampled = [k for k in self.big if estimate and tensors[k].is_floating_point()]
        self.fingerprint = Fingerprinter()
        self._last: list | None = None

    def attach(self) -> None:
        self.exact.attach()
        gen = torch.Generator().manual_seed(0)  # fixed positions; never the global RNG
        self._idx, self._s_before, self._s_after = [], [], []
        for k in self.sampled:
            t = self.tensors[k]
            idx = torch.randint(t.numel(), (self.sample,), generator=gen).sort().values
            self._idx.append(idx.to(t.device))
            self._s_before.append(torch.empty(self.sample, dtype=t.dtype, device=t.device))
            self._s_after.append(torch.empty(self.sample, dtype=t.dtype, device=t.device))

    def detach(self) -> None:
        self.exact.detach()
        self._idx = self._s_before = self._s_after = []
        self.fingerprint.clear()
        self._last = None

    def _prints(self) -> list[list[torch.Tensor]]:
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
            kernels.sub_all(self._s_before, self._s_after)
            pending.add("fp.before", [x for pair in self._fp_before for x in pair])
            pending.add("fp.after", [x for pair in self._last for x in pair])
            pending.add("s.l2", kernels.norms(self._s_before))
            pending.add("s.norm", self._big_norm)

    def resolve(self, got: dict):
        n = len(self.tensors)
        delta, changed, ratio = np.full(n, np.nan), np.zeros(n, dtype=bool), np.full(n, np.nan)
        self.value_norm = np.full(n, np.nan)  # the norm before the step, where measured
        self.exact.resolve_into(got, "small", delta, changed, ratio, self.value_norm)
        if not self.estimate:
            delta[:], ratio[:] = np.nan, np.nan
        differs = (got["fp.before"] != got["fp.after"]).reshape(-1, 2).any(axis=1)
        big = np.array(self.big, dtype=np.int64)
        changed[big] = differs
        if self.sampled:
            at = np.array(self.sampled, dtype=np.int64)
            numel = np.array([self.tensors[k].numel() for k in self.sampled], dtype=np.float64)
            est = got["s.l2"] * np.sqrt(numel / self.sample)
            est = np.where(changed[at], est, 0.0)  # an unchanged fingerprint: exactly no change
            delta[at] = est
            self.value_norm[at] = got["s.norm"]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio[at] = np.where(got["s.norm"] > 0, est / got["s.norm"], np.nan)
        return delta, changed, ratio
