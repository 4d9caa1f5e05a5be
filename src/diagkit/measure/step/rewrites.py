"""A .grad rewritten in place without a version bump, as `torch.amp.GradScaler` unscales it.

At optimizer time the observer reuses a .grad's end-of-backward norm when the .grad is the same
object at the same `_version` (a second pass over every gradient was a large part of the cost:
`benchmarks/README.md`). `GradScaler.unscale_` (`torch._amp_foreach_non_finite_check_and_unscale_`)
multiplies .grad in place without bumping `_version`, so that check passes and the reused norm
would be the scaled gradient's, not what the optimizer sees.

So at each optimizer step (in a loop diagkit does not run) the .grad norm of a few of the reused
tensors (`PROBES`) is taken again, and read back with the step. One whose norm moved shows such
a rewrite. Unscaling multiplies every gradient of an optimizer by one factor, so the other reused
norms are scaled by the same factor. Such a step is not a standard-loop step either
(`EarnedShare` never earns on it). A few norms per optimizer step, nothing per tensor.
"""

from __future__ import annotations

import numpy as np

from ..batched.kernels import norms
from ..engines.shards import local
from .state import StepState

PROBES = 3         # reused tensors per optimizer step whose .grad norm is taken again
TOLERANCE = 1e-4   # relative: two float32 norm kernels of one tensor agree far closer
TINY = 1e-15       # below, a float32 norm loses digits to underflow (`kernels.exact_norm`)


def queue(st: StepState, reused: np.ndarray, tensors: list) -> None:
    """At optimizer time: take again the .grad norm of a few of `reused` (spread over them)."""
    if not len(reused):
        return
    pick = np.unique(reused[np.linspace(0, len(reused) - 1, min(PROBES, len(reused)))
                            .astype(np.int64)])
    st.rewrite_probes.append((reused, pick, norms([local(tensors[k].grad) for k in pick.tolist()])))


def queued(st: StepState) -> list:
    """The probes' norms, in order, for the step's one read-back."""
    return [v for _, _, values in st.rewrite_probes for v in values]


def correct(st: StepState, got: np.ndarray, grad_norm: np.ndarray, grad_total: np.ndarray,
            same: np.ndarray) -> bool:
    """Scale `grad_total` of the reused tensors (`same`) of each probe group whose probe moved
    by the factor it moved by (`got`: the read-back of `queued`); True if any did."""
    at, found = 0, False
    for reused, pick, _ in st.rewrite_probes:
        now, at = np.asarray(got[at:at + len(pick)], dtype=np.float64), at + len(pick)
        fresh = grad_norm[pick]
        usable = np.flatnonzero(np.isfinite(fresh) & (fresh > TINY) & np.isfinite(now)
                                & (now > 0))
        if not len(usable):
            continue
        factor = now[usable[0]] / fresh[usable[0]]
        if abs(factor - 1) <= TOLERANCE:
            continue
        found = True
        keep = np.intersect1d(reused, same)
        grad_total[keep] = grad_norm[keep] * factor
    return found
