"""What an optimizer sees as it steps: the requires_grad, lr and .grad of the tensors it
holds, read in its step pre-hook (and, for what no optimizer stepped, as the step ends).

The .grad norm recorded as `grad_total_norm` is the one the optimizer steps on (after clipping,
unscaling, accumulation), so it is taken here, not as backward ends. A .grad nothing rewrote
since backward ended already has its norm: it is reused instead of taking a second pass over
every gradient, which was a large part of observing's cost (`benchmarks/README.md`); an
unscaling that rewrites .grad without a version bump is caught by `rewrites`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batched.kernels import norms
from ..engines.shards import local
from . import rewrites
from .state import StepState


def read_at_step(obs, indices: np.ndarray) -> None:
    """Read, for observer `obs`'s step, what the optimizer holding `indices` sees now (each
    tensor once a step: what was read already stands)."""
    st = obs.state
    idx = indices[~st.read[indices]]
    if not len(idx):
        return
    st.read[idx] = True
    tensors, ks = obs.tensors, idx.tolist()
    st.requires_grad[idx] = [tensors[k].requires_grad for k in ks]
    slots = obs.slot_of[idx]
    if (slots >= 0).any():
        st.lr[idx[slots >= 0]] = obs.group_lrs()[slots[slots >= 0]]
    untouched = obs.loop.grads_untouched_until_step
    has_grad = _with_grad(st, idx, ks, tensors, untouched)
    reusable = _reusable(st, idx, ks, tensors, has_grad, untouched)
    st.total_is_fresh.append(idx[reusable])
    if not untouched:  # a version the unscaling kernel did not bump: look at a few again
        rewrites.queue(st, idx[reusable], tensors)
    todo = idx[has_grad & ~reusable].tolist()
    grads = [tensors[k].grad for k in todo]
    with torch.no_grad():  # a DTensor's .grad: measured through this rank's shard of it
        st.total_norms.update(zip(todo, norms(list(map(local, grads)) if obs.sharded
                                              else grads)))


def _with_grad(st: StepState, idx: np.ndarray, ks: list[int], tensors: list,
               untouched: bool) -> np.ndarray:
    """Which of `idx` have a .grad now. Where the loop leaves .grad alone until the step
    (`untouched`), one measured at backward end is known to be there: not looked at again."""
    if untouched:  # measured at backward end: known to be there
        has_grad = st.on_grad[idx].copy()
        rest = np.flatnonzero(~has_grad)
        has_grad[rest] = [tensors[ks[j]].grad is not None for j in rest]
        return has_grad
    return np.array([tensors[k].grad is not None for k in ks], dtype=bool)


def _reusable(st: StepState, idx: np.ndarray, ks: list[int], tensors: list,
              has_grad: np.ndarray, untouched: bool) -> np.ndarray:
    """Which of `idx` hold a .grad nothing rewrote since backward ended (no clipping, no
    unscaling), so its norm is measured already: in a loop that promises nothing, the same
    object at the same version as then."""
    reusable = has_grad & st.on_grad[idx]
    if not untouched:
        for j in np.flatnonzero(reusable):
            g, version = st.grad_versions[ks[j]]
            reusable[j] = tensors[ks[j]].grad is g and g._version == version
    return reusable
