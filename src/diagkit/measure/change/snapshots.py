"""Where exact mode keeps each tensor's value before the step, laid out once when the probe
attaches (`Snapshots`): small float tensors of one shape, dtype and device share a (count,
*shape) matrix per bucket group, the rest have a buffer each (`snapshot_pass.buffers`).

Grouping is what lets a norm take one kernel per group instead of one per tensor: on models
with hundreds of small tensors that per-tensor overhead was most of the cost. The layout also
fixes the order the probe queues its per-tensor norms in (`order`), so that resolving a step
is a handful of vectorised operations over arrays in that order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from . import snapshot_pass
from ..batched.buckets import Buckets
from .parts import RISK


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


class Snapshots:
    """The snapshot buffers of `tensors[indices]`: `float_pos` and `other_pos` are the
    positions (into `indices`) of the float tensors and of the others (decided element-wise,
    never grouped). Float tensor `j` is `indices[float_pos[j]]`; its snapshot is `snap(j)`.

    Built empty, so that a probe whose `allocate` failed half-way can still `clear` what it
    took."""

    def __init__(self, tensors, indices: list[int], float_pos: list[int], other_pos: list[int]):
        self.tensors, self.indices = tensors, indices
        self.float_pos, self.other_pos = float_pos, other_pos
        self.j_of = {indices[p]: j for j, p in enumerate(float_pos)}
        self.buckets = Buckets(tensors, candidates=list(self.j_of))
        self.before: list[torch.Tensor | None] = [None] * len(indices)  # by position
        self.groups: list[_Group] = []

    def allocate(self, pingpong_bytes: int) -> None:
        """Allocate every buffer: each group's matrix, a spare one while `pingpong_bytes`
        lasts, and one buffer per ungrouped tensor; then the queued order of the norms."""
        self._allocate_groups(pingpong_bytes)
        # Where a grouped tensor's row lives; its snapshot is that row of the group's `cur`.
        self.row = {j: (group, r) for group in self.groups for r, j in enumerate(group.js)}
        self.loose = [j for j in range(len(self.float_pos)) if j not in self.row]
        grouped = {self.float_pos[j] for j in self.row}
        self.ungrouped = [p for p in range(len(self.indices)) if p not in grouped]
        self._lay_out_order()
        for p, buf in zip(self.ungrouped, snapshot_pass.buffers(self.now(self.ungrouped))):
            self.before[p] = buf
        # Large tensors on the CPU: the end of a step also takes the next step's snapshot.
        self.loose_cpu = {j for j in self.loose if self.float_tensor(j).device.type == "cpu"}
        self.risk = np.array([RISK[self.float_tensor(j).dtype] for j in self.order],
                             dtype=np.float64)
        self.cpu = all(self.tensors[k].device.type == "cpu" for k in self.indices)

    def _allocate_groups(self, budget: int) -> None:
        """Each bucket group's snapshot matrix, and a spare one while `budget` bytes last."""
        for g, (_, ks) in enumerate(self.buckets.groups):
            cur = self.buckets.matrix(g)
            # Two buffers that swap roles: the end of step k stacks the values into the spare
            # one (the delta needs them anyway), and that is step k+1's snapshot, no copy.
            spare = None
            if cur.nbytes <= budget:
                spare, budget = self.buckets.matrix(g), budget - cur.nbytes
            self.groups.append(_Group(g, [self.j_of[k] for k in ks],
                                      [self.tensors[k] for k in ks], cur, spare))

    def _lay_out_order(self) -> None:
        """The order in which per-tensor norms are queued (group by group, then the rest),
        the table row of each, and where each float tensor sits in it (`queue_pos`)."""
        self.order = np.array([j for group in self.groups for j in group.js] + self.loose,
                              dtype=np.int64)
        at = np.array(self.indices, dtype=np.int64)
        self.queued_at = at[np.asarray(self.float_pos, dtype=np.int64)][self.order]
        self.other_at = at[np.asarray(self.other_pos, dtype=np.int64)]
        self._pos_in_order = np.empty(len(self.order), dtype=np.int64)
        self._pos_in_order[self.order] = np.arange(len(self.order))

    def float_tensor(self, j: int) -> torch.Tensor:
        """Float tensor j itself."""
        return self.tensors[self.indices[self.float_pos[j]]]

    def snap(self, j: int) -> torch.Tensor:
        """Float tensor j's snapshot: its value before the step until `end()`, then its change."""
        if j in self.row:
            group, r = self.row[j]
            return group.cur[r]
        return self.before[self.float_pos[j]]

    def now(self, positions) -> list[torch.Tensor]:
        """The tensors at `positions` (into `indices`), as they are now."""
        return [self.tensors[self.indices[p]] for p in positions]

    def queue_pos(self, js: list[int]) -> np.ndarray:
        """Where float tensors `js` sit in the queued order."""
        return self._pos_in_order[np.asarray(js, dtype=np.int64)]

    def piece(self, values: list):
        """Norms as `Pending` takes them: one float64 tensor when everything is on the CPU
        (some are host floats already, from `snapshot_pass`), else 0-d tensors."""
        if self.cpu:
            return torch.tensor([float(v) for v in values], dtype=torch.float64)
        return [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64)
                for v in values]

    def allocated_bytes(self) -> int:
        """The bytes of the buffers `allocate()` took (each group's one or two matrices, the
        ungrouped tensors' buffers): what the probe keeps between steps."""
        groups = sum(g.cur.nbytes + (g.spare.nbytes if g.spare is not None else 0)
                     for g in self.groups)
        return groups + sum(b.nbytes for b in self.before if b is not None)

    def clear(self) -> None:
        """Let every buffer go."""
        self.before = []
        self.groups = []
        self.buckets.clear()
