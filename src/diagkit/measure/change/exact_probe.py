"""`delta="exact"`: snapshot-and-subtract, exact `changed` and `delta_norm`; extra memory 1x the
tensors' bytes (see `diagkit.measure.change.probes` for the protocol every probe follows)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from ..batched import kernels
from . import snapshot_pass
from ..batched.buckets import Buckets
from .parts import RISK, change_parts, nonfinite_change
from ..batched.readback import Pending, readback


class ExactProbe:
    """Snapshot-and-subtract over the tensors at `indices` (all of them in exact mode).

    Small tensors of one shape, dtype and device share a (count, *shape) buffer
    (`buckets.Buckets`), so their norms take one kernel per group instead of one per tensor: on
    models with hundreds of small tensors that per-tensor overhead was most of the cost.
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
        self._before: list[torch.Tensor] = []
        self._decided: dict[int, float] = {}
        self._primed = False  # the snapshot `attach()` took is still this step's before
        # The tensors whose value checksum the observer wants at `end()` (ranks compared), and
        # those the snapshot pass took in passing (`checksums`, by index): not read again.
        self.checksum_of: set[int] = set()
        self.checksums: dict[int, torch.Tensor] = {}

    PINGPONG_BYTES = 64 << 20  # a second buffer per group, up to this much in all

    def attach(self) -> None:
        tensors = [self.tensors[k] for k in self.indices]
        j_of = {self.indices[p]: j for j, p in enumerate(self.float_pos)}
        self.buckets = Buckets(self.tensors, candidates=list(j_of))
        self._before = [None] * len(tensors)
        self._groups = []
        budget = self.PINGPONG_BYTES
        for g, (_, ks) in enumerate(self.buckets.groups):
            cur = self.buckets.matrix(g)
            # Two buffers that swap roles: the end of step k stacks the values into the spare
            # one (the delta needs them anyway), and that is step k+1's snapshot, no copy.
            spare = None
            if cur.nbytes <= budget:
                spare, budget = self.buckets.matrix(g), budget - cur.nbytes
            group = _Group(g, [j_of[k] for k in ks], [self.tensors[k] for k in ks], cur, spare)
            self._groups.append(group)
        # Where a grouped tensor's row lives; its snapshot is that row of the group's `cur`.
        self._row = {j: (group, r) for group in self._groups for r, j in enumerate(group.js)}
        self._loose = [j for j in range(len(self.float_pos)) if j not in self._row]
        grouped = {self.float_pos[j] for j in self._row}
        self._ungrouped = [p for p in range(len(tensors)) if p not in grouped]
        # The order in which per-tensor norms are queued: group by group, then the rest.
        self._order = np.array([j for group in self._groups for j in group.js] + self._loose,
                               dtype=np.int64)
        at = np.array(self.indices, dtype=np.int64)
        # The table row of each queued norm.
        self._queued_at = at[np.asarray(self.float_pos, dtype=np.int64)][self._order]
        self._other_at = at[np.asarray(self.other_pos, dtype=np.int64)]
        buffers = snapshot_pass.buffers([tensors[p] for p in self._ungrouped])
        for p, buf in zip(self._ungrouped, buffers):
            self._before[p] = buf
        # Large tensors on the CPU: the end of a step also takes the next step's snapshot
        # (`_end_loose`), and the next begin finds it there (`_ahead`: j -> its norm).
        self._loose_cpu = {j for j in self._loose
                           if tensors[self.float_pos[j]].device.type == "cpu"}
        self._ahead: dict[int, torch.Tensor] = {}
        self._risk = np.array([RISK[self.tensors[self.indices[self.float_pos[j]]].dtype]
                               for j in self._order], dtype=np.float64)
        self._cpu = all(self.tensors[k].device.type == "cpu" for k in self.indices)
        with torch.no_grad():  # touch every page now: allocation is a one-off cost
            self.begin()
        if not self._cpu:
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
        return set(self._order[np.flatnonzero(~(got < self._risk))].tolist())

    def _snap(self, j: int) -> torch.Tensor:
        """Float tensor j's snapshot: its value before the step until `end()`, then its change."""
        if j in self._row:
            group, r = self._row[j]
            return group.cur[r]
        return self._before[self.float_pos[j]]

    def detach(self) -> None:
        self._before = []
        self._groups = []
        self.buckets.clear()

    def allocated_bytes(self) -> int:
        """The bytes of the snapshot buffers `attach()` allocated (each group's one or two
        matrices, the ungrouped tensors' buffers): what this probe keeps between steps."""
        groups = sum(g.cur.nbytes + (g.spare.nbytes if g.spare is not None else 0)
                     for g in self._groups)
        return groups + sum(b.nbytes for b in self._before if b is not None)

    def begin(self, consecutive: bool = False) -> None:
        primed, self._primed = self._primed, False
        if consecutive and primed:  # nothing ran since `attach()` took the snapshot
            return
        norms = []
        with torch.no_grad():
            for group in self._groups:
                if consecutive and group.next_norm is not None:
                    group.cur, group.spare = group.spare, group.cur
                    norms.append(group.next_norm)
                else:
                    torch.stack(group.members, out=group.cur)
                    norms.append(kernels.row_norms(group.cur))
                group.next_norm = None
            ahead, self._ahead = (self._ahead if consecutive else {}), {}
            taken = {self.float_pos[j] for j in ahead}
            copy = [p for p in self._ungrouped if p not in taken] if taken else self._ungrouped
            kernels.copy_all([self._before[p] for p in copy], self._now(copy))
            if self._loose:
                todo = [j for j in self._loose if j not in ahead]
                fresh = dict(zip(todo, kernels.norms([self._snap(j) for j in todo])))
                norms.append(self._piece([ahead[j] if j in ahead else fresh[j]
                                          for j in self._loose]))
            self._before_norm = norms
            if not consecutive and self._cpu:
                # Values may have moved unobserved: on the CPU, reading the norms is free.
                # Elsewhere the last step's knowledge stands (docs/cost.md, "Cost of observation").
                self._careful = self._careful_now()

    def end(self, pending: Pending, tag: str = "x") -> None:
        self._primed = False
        self.checksums = {}
        with torch.no_grad():
            # First, while `before` still exists: the element-wise decisions.
            self._careful_checked = sorted(self._careful)
            pending.add(f"{tag}.careful", [v for j in self._careful_checked for v in change_parts(
                self._snap(j), self.tensors[self.indices[self.float_pos[j]]])])
            pending.add(f"{tag}.other", [v for p in self.other_pos for v in change_parts(
                self._before[p], self.tensors[self.indices[p]])])
            changes = []
            for group in self._groups:  # each group's passes back to back, while it is cached
                after = group.spare
                if after is not None:
                    torch.stack(group.members, out=after)
                    group.next_norm = kernels.row_norms(after)
                else:
                    after = self.buckets.stacked(group.g, group.members)
                changes.append(kernels.row_norms(group.cur.sub_(after)))
            self._checked = sorted(self._expect_zero)
            if self._loose:
                changes.append(self._end_loose())
            pending.add(f"{tag}.before", [])  # the names exist even with no float tensor
            pending.add(f"{tag}.l2", [])
            for part in self._before_norm:
                pending.add(f"{tag}.before", part)
            for part in changes:
                pending.add(f"{tag}.l2", part)
            pending.add(f"{tag}.zero", [kernels.max_abs(self._snap(j)) for j in self._checked])

    def _end_loose(self):
        """The change norms of the ungrouped tensors, in `_loose` order.

        On the CPU each tensor is done whole, chunk by chunk while a chunk is in cache
        (`snapshot_pass`): the change's norm, the snapshot refreshed as the next step's, and
        the value's norm, in three passes over memory instead of seven. A tensor queued for
        an element-wise check (expected zero, or careful) keeps its change for `resolve`, as
        does everything off the CPU: one batched kernel per operation there.
        """
        self._decided = {}  # j -> its change norm, 0 or inf: exact already (`snapshot_pass`)
        keep = set(self._checked) | set(self._careful_checked)
        ahead_ok = self._loose_cpu - keep if self._loose_cpu else ()
        batched = [j for j in self._loose if j not in ahead_ok]
        kernels.sub_all([self._snap(j) for j in batched], self._now(
            [self.float_pos[j] for j in batched]))
        out = dict(zip(batched, kernels.norms([self._snap(j) for j in batched])))
        before_norms = self._before_norm[-1] if ahead_ok else ()  # in `_loose` order
        for at, j in enumerate(self._loose):
            if j not in ahead_ok:
                continue
            k = self.indices[self.float_pos[j]]
            before, now = self._snap(j), self.tensors[k]
            if snapshot_pass.fits(before, now):  # its norm before: on the CPU, a free read
                got = snapshot_pass.change_and_refresh(
                    before, now, before_had_nan=math.isnan(float(before_norms[at])),
                    checksum=k in self.checksum_of)
                out[j], self._ahead[j] = got.norm, got.value
                if got.checksum is not None:
                    self.checksums[k] = got.checksum
                if got.rare:
                    self._decided[j] = got.norm
                continue
            before.sub_(now)
            out[j] = change = kernels.norm(before)
            if 0 < float(change) < math.inf:  # a host read, but on the CPU that is free
                before.copy_(now)
                self._ahead[j] = kernels.norm(before)
        return self._piece([out[j] for j in self._loose])

    def _piece(self, values: list):
        """Norms as `Pending` takes them: one float64 tensor when everything is on the CPU
        (some are host floats already, from `snapshot_pass`), else 0-d tensors."""
        if self._cpu:
            return torch.tensor([float(v) for v in values], dtype=torch.float64)
        return [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64)
                for v in values]

    def _now(self, positions) -> list[torch.Tensor]:
        return [self.tensors[self.indices[p]] for p in positions]

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

        Works in the order the norms were queued (`_order`: group by group), so the common
        step is a handful of vectorised operations; only the rare tensor whose norm is 0 or
        non-finite is looked at one by one.
        """
        before = got[f"{tag}.before"]
        l2 = got[f"{tag}.l2"]  # a view of this step's read-back: ours to rewrite
        order = self._order
        fchanged = np.zeros(len(l2), dtype=bool)
        decided = np.zeros(len(l2), dtype=bool)
        if self._careful_checked:  # decided element-wise in `end()`
            parts = got[f"{tag}.careful"].reshape(-1, 3)
            q = self._queue_pos(self._careful_checked)
            fchanged[q], l2[q], decided[q] = parts[:, 0] != 0, parts[:, 1], True
        zero_now = set()
        if self._decided:  # 0 or inf, decided in `end()` (`snapshot_pass`): exact already
            q = self._queue_pos(list(self._decided))
            l2[q] = list(self._decided.values())
            fchanged[q], decided[q] = l2[q] != 0, True
            zero_now.update(j for j, size in self._decided.items() if size == 0)
        rare = np.flatnonzero(~decided & (~(l2 > 0) | np.isinf(l2)))  # 0, inf or NaN
        checked = dict(zip(self._checked, got[f"{tag}.zero"]))
        for q in rare:
            j = int(order[q])
            diff = self._snap(j)
            if np.isnan(l2[q]):  # a NaN, or inf - inf: decided element by element
                fchanged[q], l2[q] = nonfinite_change(
                    diff, self.tensors[self.indices[self.float_pos[j]]],
                    before_had_nan=bool(np.isnan(before[q])))
                continue
            # 0: underflow or truly unchanged; inf: overflow or a change to or from inf.
            mx = checked[j] if j in checked else float(kernels.max_abs(diff))
            l2[q] = 0.0 if mx == 0 else kernels.exact_norm(diff)
            fchanged[q] = l2[q] != 0
            if l2[q] == 0:
                zero_now.add(j)
        plain = ~decided
        plain[rare] = False
        fchanged[plain] = l2[plain] != 0
        self._expect_zero = zero_now
        # The value after this step is the next one's before: |after| <= |before| + |change|.
        with np.errstate(invalid="ignore"):
            self._careful = set(order[np.flatnonzero(~(before + l2 < self._risk))].tolist())
        f = self._queued_at
        delta[f] = l2
        changed[f] = fchanged
        with np.errstate(invalid="ignore"):  # inf / inf: NaN
            ratio[f] = np.divide(l2, before, out=np.full(len(l2), np.nan), where=before > 0)
        value[f] = before
        others = self._other_at
        parts = got[f"{tag}.other"].reshape(-1, 3)
        changed[others], delta[others], value[others] = parts[:, 0] != 0, parts[:, 1], parts[:, 2]
        with np.errstate(invalid="ignore"):
            ratio[others] = np.divide(parts[:, 1], parts[:, 2],
                                      out=np.full(len(parts), np.nan), where=parts[:, 2] > 0)

    def _queue_pos(self, js: list[int]) -> np.ndarray:
        """Where float tensors `js` sit in the queued order."""
        if not hasattr(self, "_pos_in_order"):
            self._pos_in_order = np.empty(len(self._order), dtype=np.int64)
            self._pos_in_order[self._order] = np.arange(len(self._order))
        return self._pos_in_order[np.asarray(js, dtype=np.int64)]


@dataclasses.dataclass(slots=True)
class _Group:
    """One bucket group's snapshot: its members (`js`: positions in `float_pos`, `members`:
    the tensors), `cur` the (count, *shape) snapshot of the values before the step, `spare` a
    second buffer the end of a step stacks the values into (then the next step's snapshot:
    the two swap; None past the ping-pong budget), `next_norm` its row norms once taken."""

    g: int
    js: list[int]
    members: list[torch.Tensor]
    cur: torch.Tensor
    spare: torch.Tensor | None
    next_norm: torch.Tensor | None = None
