"""Which strategy observes each tensor's gradients, planned once when an observer is built.

Every tensor is observed by exactly one strategy (`diagkit.measure.step.gradients`): a backward
hook (`backward_hooks`), or its optimizer's share (the tensors it holds that no earlier
optimizer holds). What the loop guarantees (`LoopFacts`) decides: diagkit's standard loop reads
shares without hooks from the start (`OptimizerShare`); a user's loop without a process group
may earn it at run time (`EarnedShare`, hooked until then); otherwise every tensor is hooked.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .earned_share import EarnedShare
from ..engines.fsdp1 import ViewHooks
from ..engines.zero import ZeroView
from .backward_hooks import BackwardHooks
from .gradients import GradientStrategy, OptimizerShare


@dataclasses.dataclass
class Plan:
    strategies: list[GradientStrategy]
    earned: list[EarnedShare]
    read_by: list[np.ndarray]  # per optimizer: what its pre-hook reads itself


def plan_strategies(obs, held_by: list[np.ndarray], handles: list) -> Plan:
    """The strategies of observer `obs`, whose optimizer i holds the tensors `held_by[i]`;
    hooks an earned share sets again go to `handles`."""
    loop, args = obs.loop, (obs.grad_buckets, obs.slot_of)
    parts = _share_indices(obs.n, held_by)
    shares = ([OptimizerShare(obs, i, mine, *args) for i, mine in parts]
              if loop.hookless_shares else [])
    shared = np.zeros(obs.n, dtype=bool)
    for share in shares:
        shared[share.idx] = True
    hooks = BackwardHooks(obs, np.flatnonzero(~shared).tolist(),
                          keep_own=any(isinstance(o, ZeroView) for o in obs.optimizers))
    earned = ([EarnedShare(obs, i, mine, *args, hooks, handles) for i, mine in parts]
              if loop.may_earn_shares and not loop.hookless_shares else [])
    # A share's tensors are read by the share; an earned one's by the pre-hook until earned.
    read_by = [np.setdiff1d(ks, next((s.idx for s in shares if s.optimizer == i), ks[:0]))
               for i, ks in enumerate(held_by)]
    views = ([ViewHooks(obs.inv.model, obs.tensors, hooks.hook_for, lambda: obs.active)]
             if obs.inv.slices else [])  # FSDP1: autograd reaches the views, not the tensors
    return Plan([hooks, *views, *shares, *earned], earned, read_by)


def _share_indices(n: int, held_by: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    """(optimizer, the tensors it holds that no earlier optimizer holds), non-empty."""
    out, taken = [], np.zeros(n, dtype=bool)
    for i, ks in enumerate(held_by):
        mine = ks[~taken[ks]]
        taken[mine] = True
        if len(mine):
            out.append((i, mine))
    return out
