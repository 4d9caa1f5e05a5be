"""`delta="exact"`: snapshot-and-subtract, exact `changed` and `delta_norm`; extra memory 1x the
tensors' bytes (see `diagkit.measure.change.probes` for the protocol every probe follows)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..batched import kernels
from . import snapshot_pass
from .parts import change_parts, nonfinite_change
from ..batched.readback import Pending, readback
from .snapshots import Snapshots


class ExactProbe:
    """Snapshot-and-subtract over the tensors at `indices` (all of them in exact mode).

    The snapshots live in `Snapshots` (small tensors of one shape share a matrix, so their
    norms take one kernel per group); this class is the per-step protocol over them: what
    is known of each tensor's values, what is queued at `end()`, how `resolve()` decides.
    """

    def __init__(self, tensors, indices, likely_static: set[int]):
        self.tensors = tensors
        self.indices = list(indices)
        self.float_pos = [p for p, k in enumerate(self.indices) if kernels.is_float(tensors[k])]
        # Integers, bool, complex, float8: decided element-wise (`change_parts`) each step.
        self.other_pos = [p for p, k in enumerate(self.indices)
                          if not kernels.is_float(tensors[k])]
        # Positions (into float_pos) whose change we expect to be exactly zero: for those an
        # exact zero check is queued with the norms, so confirming them costs no extra sync.
        self._expect_zero = {j for j, p in enumerate(self.float_pos)
                             if self.indices[p] in likely_static}
        # Positions that held NaN, inf or values large enough for `before - after` to
        # overflow, as far as the host knows (`_careful_next`): decided element-wise from
        # before and after, queued with the step, before the subtraction destroys `before`.
        self._careful: set[int] = set()
        self._decided: dict[int, float] = {}
        self._primed = False  # the snapshot `attach()` took is still this step's before
        # The tensors whose value checksum the observer wants at `end()` (ranks compared), and
        # those the snapshot pass took in passing (`checksums`, by index): not read again.
        self.checksum_of: set[int] = set()
        self.checksums: dict[int, torch.Tensor] = {}

    PINGPONG_BYTES = 64 << 20  # a second buffer per group, up to this much in all

    def attach(self) -> None:
        """Allocate the snapshots and take the first one; off the CPU, read back once which
        tensors need care (`_careful_now`)."""
        self.snaps = Snapshots(self.tensors, self.indices, self.float_pos, self.other_pos)
        self.snaps.allocate(self.PINGPONG_BYTES)
        # Large tensors on the CPU: the end of a step also takes the next step's snapshot
        # (`_end_loose`), and the next begin finds it there (`_ahead`: j -> its norm).
        self._ahead: dict[int, torch.Tensor] = {}
        with torch.no_grad():  # touch every page now: allocation is a one-off cost
            self.begin()
        if not self.snaps.cpu:
            self._careful = self._careful_now()  # one read-back, at attach only
        # What attach took is the first step's snapshot if nothing runs before it: a
        # consecutive first `begin` keeps it instead of copying every tensor again.
        self._primed = True

    def _careful_now(self) -> set[int]:
        """The tensors whose value (before the step now begun) holds NaN, inf or values that
        could overflow the subtraction, from the norms `begin()` took (a host read)."""
        pieces = [p.reshape(-1) if isinstance(p, torch.Tensor) else torch.stack(p).reshape(-1)
                  for p in self._before_norm if len(p)]
        if not pieces:
            return set()
        got = readback([p.to(torch.float64) for p in pieces])
        return set(self.snaps.order[np.flatnonzero(~(got < self.snaps.risk))].tolist())

    def detach(self) -> None:
        """Free the snapshots (`Probe.detach`)."""
        self.snaps.clear()

    def allocated_bytes(self) -> int:
        """The bytes of the snapshot buffers `attach()` allocated (each group's one or two
        matrices, the ungrouped tensors' buffers): what this probe keeps between steps."""
        return self.snaps.allocated_bytes()

    def begin(self, consecutive: bool = False) -> None:
        """Snapshot the values before the step and queue their norms (`Probe.begin`); a
        consecutive step takes over what the last `end()` took ahead instead of copying."""
        primed, self._primed = self._primed, False
        if consecutive and primed:  # nothing ran since `attach()` took the snapshot
            return
        snaps, norms = self.snaps, []
        with torch.no_grad():
            for group in snaps.groups:
                if consecutive and group.next_norm is not None:
                    group.cur, group.spare = group.spare, group.cur
                    norms.append(group.next_norm)
                else:
                    torch.stack(group.members, out=group.cur)
                    norms.append(kernels.row_norms(group.cur))
                group.next_norm = None
            ahead, self._ahead = (self._ahead if consecutive else {}), {}
            taken = {self.float_pos[j] for j in ahead}
            copy = [p for p in snaps.ungrouped if p not in taken] if taken else snaps.ungrouped
            kernels.copy_all([snaps.before[p] for p in copy], snaps.now(copy))
            if snaps.loose:
                todo = [j for j in snaps.loose if j not in ahead]
                fresh = dict(zip(todo, kernels.norms([snaps.snap(j) for j in todo])))
                norms.append(snaps.piece([ahead[j] if j in ahead else fresh[j]
                                          for j in snaps.loose]))
            self._before_norm = norms
            if not consecutive and snaps.cpu:
                # Values may have moved unobserved: on the CPU, reading the norms is free.
                # Elsewhere the last step's knowledge stands (docs/cost.md, "Cost of observation").
                self._careful = self._careful_now()

    def end(self, pending: Pending, tag: str = "x") -> None:
        """Queue the step's change norms under `tag` (`Probe.end`): first the element-wise
        decisions, while the values before still exist, then the subtractions in place."""
        self._primed = False
        self.checksums = {}
        snaps = self.snaps
        with torch.no_grad():
            # First, while `before` still exists: the element-wise decisions.
            self._careful_checked = sorted(self._careful)
            pending.add(f"{tag}.careful", [v for j in self._careful_checked for v in change_parts(
                snaps.snap(j), snaps.float_tensor(j))])
            pending.add(f"{tag}.other", [v for p in self.other_pos for v in change_parts(
                snaps.before[p], self.tensors[self.indices[p]])])
            changes = []
            for group in snaps.groups:  # each group's passes back to back, while it is cached
                after = group.spare
                if after is not None:
                    torch.stack(group.members, out=after)
                    group.next_norm = kernels.row_norms(after)
                else:
                    after = snaps.buckets.stacked(group.g, group.members)
                changes.append(kernels.row_norms(group.cur.sub_(after)))
            self._checked = sorted(self._expect_zero)
            if snaps.loose:
                changes.append(self._end_loose())
            pending.add(f"{tag}.before", [])  # the names exist even with no float tensor
            pending.add(f"{tag}.l2", [])
            for part in self._before_norm:
                pending.add(f"{tag}.before", part)
            for part in changes:
                pending.add(f"{tag}.l2", part)
            pending.add(f"{tag}.zero", [kernels.max_abs(snaps.snap(j)) for j in self._checked])

    def _end_loose(self):
        """The change norms of the ungrouped tensors, in `loose` order.

        On the CPU each tensor is done whole, chunk by chunk while a chunk is in cache
        (`snapshot_pass`): the change's norm, the snapshot refreshed as the next step's, and
        the value's norm, in three passes over memory instead of seven. A tensor queued for
        an element-wise check (expected zero, or careful) keeps its change for `resolve`, as
        does everything off the CPU: one batched kernel per operation there.
        """
        snaps = self.snaps
        self._decided = {}  # j -> its change norm, 0 or inf: exact already (`snapshot_pass`)
        keep = set(self._checked) | set(self._careful_checked)
        ahead_ok = snaps.loose_cpu - keep if snaps.loose_cpu else ()
        batched = [j for j in snaps.loose if j not in ahead_ok]
        kernels.sub_all([snaps.snap(j) for j in batched], snaps.now(
            [self.float_pos[j] for j in batched]))
        out = dict(zip(batched, kernels.norms([snaps.snap(j) for j in batched])))
        before_norms = self._before_norm[-1] if ahead_ok else ()  # in `loose` order
        for at, j in enumerate(snaps.loose):
            if j in ahead_ok:
                out[j] = self._end_one(j, before_norms[at])
        return snaps.piece([out[j] for j in snaps.loose])

    def _end_one(self, j: int, before_norm):
        """Float tensor j's change norm, on the CPU, and its snapshot made the next step's
        (`_ahead`) while it is in cache. `before_norm`: its norm before the step."""
        k = self.indices[self.float_pos[j]]
        before, now = self.snaps.snap(j), self.tensors[k]
        if snapshot_pass.fits(before, now):  # its norm before: on the CPU, a free read
            got = snapshot_pass.change_and_refresh(
                before, now, before_had_nan=math.isnan(float(before_norm)),
                checksum=k in self.checksum_of)
            self._ahead[j] = got.value
            if got.checksum is not None:
                self.checksums[k] = got.checksum
            if got.rare:
                self._decided[j] = got.norm
            return got.norm
        before.sub_(now)
        change = kernels.norm(before)
        if 0 < float(change) < math.inf:  # a host read, but on the CPU that is free
            before.copy_(now)
            self._ahead[j] = kernels.norm(before)
        return change

    def resolve(self, got: dict):
        """(delta_norm, changed, update_ratio) of every tensor, for this step; `value_norm`
        then holds each tensor's norm before it (to combine ratios over shards)."""
        n = len(self.tensors)
        delta, changed, ratio = np.zeros(n), np.zeros(n, dtype=bool), np.full(n, np.nan)
        self.value_norm = np.full(n, np.nan)
        self.resolve_into(got, "x", delta, changed, ratio, self.value_norm)
        return delta, changed, ratio

    def resolve_into(self, got: dict, tag: str, delta, changed, ratio, value) -> None:
        """Fill the rows of `indices` in the four per-tensor arrays (`value`: the norm before).

        Works in the order the norms were queued (`Snapshots.order`: group by group), so the
        common step is a handful of vectorised operations; only the rare tensor whose norm is
        0 or non-finite is looked at one by one.
        """
        before = got[f"{tag}.before"]
        l2 = got[f"{tag}.l2"]  # a view of this step's read-back: ours to rewrite
        fchanged, decided, zero_now = self._decided_already(got, tag, l2)
        rare = np.flatnonzero(~decided & (~(l2 > 0) | np.isinf(l2)))  # 0, inf or NaN
        zero_now |= self._settle_rare(rare, got, tag, before, l2, fchanged)
        plain = ~decided
        plain[rare] = False
        fchanged[plain] = l2[plain] != 0
        self._expect_zero = zero_now
        order = self.snaps.order
        # The value after this step is the next one's before: |after| <= |before| + |change|.
        with np.errstate(invalid="ignore"):
            self._careful = set(order[np.flatnonzero(~(before + l2 < self.snaps.risk))].tolist())
        f = self.snaps.queued_at
        delta[f] = l2
        changed[f] = fchanged
        with np.errstate(invalid="ignore"):  # inf / inf: NaN
            ratio[f] = np.divide(l2, before, out=np.full(len(l2), np.nan), where=before > 0)
        value[f] = before
        self._fill_others(got, tag, delta, changed, ratio, value)

    def _decided_already(self, got: dict, tag: str, l2: np.ndarray):
        """(changed, decided, zero_now) in queued order, from what `end()` decided: the
        careful tensors element-wise, and the snapshot pass's exact 0 or inf."""
        fchanged = np.zeros(len(l2), dtype=bool)
        decided = np.zeros(len(l2), dtype=bool)
        if self._careful_checked:  # decided element-wise in `end()`
            parts = got[f"{tag}.careful"].reshape(-1, 3)
            q = self.snaps.queue_pos(self._careful_checked)
            fchanged[q], l2[q], decided[q] = parts[:, 0] != 0, parts[:, 1], True
        zero_now = set()
        if self._decided:  # 0 or inf, decided in `end()` (`snapshot_pass`): exact already
            q = self.snaps.queue_pos(list(self._decided))
            l2[q] = list(self._decided.values())
            fchanged[q], decided[q] = l2[q] != 0, True
            zero_now.update(j for j, size in self._decided.items() if size == 0)
        return fchanged, decided, zero_now

    def _settle_rare(self, rare: np.ndarray, got: dict, tag: str, before: np.ndarray,
                     l2: np.ndarray, fchanged: np.ndarray) -> set[int]:
        """Decide one by one the queued norms `rare` that came out 0, inf or NaN (exact at the
        edges: 0 only when unchanged). Returns the float tensors found unchanged."""
        order, zero_now = self.snaps.order, set()
        checked = dict(zip(self._checked, got[f"{tag}.zero"]))
        for q in rare:
            j = int(order[q])
            diff = self.snaps.snap(j)
            if np.isnan(l2[q]):  # a NaN, or inf - inf: decided element by element
                fchanged[q], l2[q] = nonfinite_change(
                    diff, self.snaps.float_tensor(j), before_had_nan=bool(np.isnan(before[q])))
                continue
            # 0: underflow or truly unchanged; inf: overflow or a change to or from inf.
            mx = checked[j] if j in checked else float(kernels.max_abs(diff))
            l2[q] = 0.0 if mx == 0 else kernels.exact_norm(diff)
            fchanged[q] = l2[q] != 0
            if l2[q] == 0:
                zero_now.add(j)
        return zero_now

    def _fill_others(self, got: dict, tag: str, delta, changed, ratio, value) -> None:
        """The rows of the tensors `end()` decided element-wise (not float): as they came."""
        others = self.snaps.other_at
        parts = got[f"{tag}.other"].reshape(-1, 3)
        changed[others], delta[others], value[others] = parts[:, 0] != 0, parts[:, 1], parts[:, 2]
        with np.errstate(invalid="ignore"):
            ratio[others] = np.divide(parts[:, 1], parts[:, 2],
                                      out=np.full(len(parts), np.nan), where=parts[:, 2] > 0)
