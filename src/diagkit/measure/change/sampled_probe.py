"""`delta="sampled"` and `delta="off"`: bounded memory, exact `changed` from fingerprints (see
`diagkit.measure.change.probes` for the protocol every probe follows)."""

from __future__ import annotations

import numpy as np
import torch

from ..batched import kernels
from .parts import row_change_norms
from .exact_probe import ExactProbe
from .fingerprint import Prints, stored_as_code
from ..batched.readback import Pending


class FingerprintProbe:
    """`sampled` (estimate=True) and `off`: bounded memory, exact `changed`.

    Tensors of at most `sample` elements are snapshotted exactly (cheaper than hashing many
    small tensors one by one); larger ones, and integer and quantised storage of any size,
    are fingerprinted, and float ones sampled when estimating. Meta tensors are never read.
    """

    def __init__(self, tensors, likely_static: set[int], sample: int, estimate: bool):
        self.tensors = tensors
        self.sample = sample
        self.estimate = estimate
        # A meta tensor has no values: in no list, its row stays NaN / unchanged.
        real = [k for k, t in enumerate(tensors) if t.device.type != "meta"]
        small = [k for k in real if snapshotted(tensors[k], sample)]
        self.exact = ExactProbe(tensors, small, likely_static)
        self.big = sorted(set(real) - set(small))
        self.sampled = [k for k in self.big if estimate and kernels.is_float(tensors[k])]
        self.prints = Prints(tensors, self.big)
        self.checksum_of: set[int] = set()
        self.checksums: dict[int, torch.Tensor] = {}  # never taken in passing here (`Probe`)

    def attach(self) -> None:
        self.exact.attach()
        self.prints.attach()
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
        self.prints.clear()

    def allocated_bytes(self) -> int:
        """The bytes this probe keeps between steps: the small tensors' snapshots and the
        samples (the fingerprint's 1 MiB scratch per device is not counted)."""
        return self.exact.allocated_bytes() + sum(
            before.nbytes + after.nbytes for before, after in self._kinds)

    def _take(self, out: list[torch.Tensor]) -> None:
        for k, idx, buf in zip(self.sampled, self._idx, out):
            torch.take(self.tensors[k].detach(), idx, out=buf)

    def begin(self, consecutive: bool = False) -> None:
        """`consecutive`: nothing ran since the last `end()`, so its fingerprints still hold."""
        self.exact.begin(consecutive)
        self.prints.begin(consecutive)
        with torch.no_grad():
            self._big_norm = kernels.norms([self.tensors[k] for k in self.sampled])
            self._take(self._s_before)

    def end(self, pending: Pending) -> None:
        self.exact.end(pending, "small")
        self.prints.end(pending, "fp")
        with torch.no_grad():
            self._take(self._s_after)
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
        changed[big] = self.prints.changed(got, "fp")
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



def snapshotted(t: torch.Tensor, sample: int) -> bool:
    """Snapshotted in `sampled`/`off`: a tensor of at most `sample` elements holding values
    (integer and quantised storage is always fingerprinted: `fingerprint.stored_as_code`)."""
    return t.numel() <= sample and not stored_as_code(t)
