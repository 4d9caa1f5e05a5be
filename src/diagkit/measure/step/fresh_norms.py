"""The fresh gradients' norms: queued on the `StepState` as each backward ends or each
optimizer share is read (`measure_fresh`), and turned into exact per-tensor values from the
step's one read-back (`resolve_fresh`). Both strategies (`backward_hooks.BackwardHooks`,
`gradients.OptimizerShare`) measure through here, so a gradient's norm means the same
whichever observed it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batched.buckets import Layout
from ..batched.kernels import exact_norm, max_abs
from .state import StepState


def measure_fresh(st: StepState, layout: Layout, grads: list, zero_expected: set[int]) -> None:
    """Queue the norms of one backward's gradients (`grads` at `layout`'s positions, None where
    there is none), and an exact-zero check where a zero is expected (same read-back)."""
    with torch.no_grad():
        st.fresh_norms += layout.norms(grads)
        for k in zero_expected:
            g = layout.get(grads, k)
            if g is not None:
                st.fresh_zero[k] = max_abs(g)
    st.fresh_grads.append((layout, grads))


def resolve_fresh(st: StepState, values: np.ndarray, zero_checked: dict, n: int,
                  stale: np.ndarray | None = None):
    """(grad_norm, nonfinite, zero_now) per tensor from the read-back norms `values`.

    Exact at the edges: 0 only when every element is 0, non-finite only when an element is;
    the float32 norm decides all other tensors. `zero_now`: tensors whose gradient was exactly
    zero, expected to be zero again next step. `stale`: mask over `values` of norms measured
    by a backward whose optimizer step was skipped (`skips.merged_skips`): not `nonfinite`.
    """
    grad_norm = np.full(n, np.nan)
    nonfinite = np.zeros(n, dtype=bool)
    fresh = (np.concatenate([np.asarray(ks, dtype=np.int64) for ks, _ in st.fresh_norms])
             if st.fresh_norms else np.zeros(0, dtype=np.int64))
    l2 = np.asarray(values, dtype=np.float64)
    if len(st.fresh_grads) > 1:  # a later backward of the same step supersedes
        _, first = np.unique(fresh[::-1], return_index=True)
        last = len(fresh) - 1 - first
        fresh, l2 = fresh[last], l2[last]
        stale = None if stale is None else stale[last]
    zero_now = set()
    for j in np.flatnonzero(~(np.isfinite(l2) & (l2 > 0))):
        k = int(fresh[j])
        g = _fresh_grad(st, k)
        mx = zero_checked[k] if k in zero_checked else float(max_abs(g))
        if not np.isfinite(mx):  # a NaN or Inf element: the norm stays NaN or inf
            nonfinite[k] = stale is None or not stale[j]
        else:
            l2[j] = 0.0 if mx == 0 else exact_norm(g)
            if l2[j] == 0:
                zero_now.add(k)
    grad_norm[fresh] = l2
    return grad_norm, nonfinite, zero_now


def _fresh_grad(st: StepState, k: int) -> torch.Tensor:
    """Tensor k's gradient of this step's last backward that reached it."""
    for layout, grads in reversed(st.fresh_grads):
        g = layout.get(grads, k)
        if g is not None:
            return g
    raise KeyError(k)
