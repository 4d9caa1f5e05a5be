"""The end of an observed step: everything the step measured on the devices, read back at once
(`queue`), and made into the step's per-tensor values (`resolve`).

One read-back per step and device is what keeps observing cheap: a host sync per tensor, or
per kind of value, costs more than the step itself on a GPU. So the probe's change norms, the
fresh and total gradient norms, the zero and carried checks, the reset and rewrite probes, the
checksums and the loss all ride on one `Pending`; `resolve` then decides the rare values one by
one (exact at 0, inf and NaN) and combines a sharded tensor's values over its ranks.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..batched.kernels import checksum
from ..batched.readback import Pending
from . import rewrites
from .fresh_norms import resolve_fresh
from .skips import merged_skips
from .state import StepState


@dataclasses.dataclass
class Resolved:
    """One step's values per tensor (arrays over all tensors), and its optimizers' skips."""

    delta: np.ndarray
    changed: np.ndarray
    ratio: np.ndarray
    grad_norm: np.ndarray
    grad_total: np.ndarray
    nonfinite: np.ndarray
    carried_grad: np.ndarray
    zero_now: set[int]  # exactly-zero fresh gradients: checked for zero again next step
    skipping: np.ndarray  # per optimizer: skipped this step (`skips.Holdings.skipping`)
    merged: int  # optimizer steps skipped inside the step (`skips.merged_skips`)


def queue(obs, st: StepState, loss) -> tuple[Pending, dict]:
    """Every device scalar of observer `obs`'s step on one `Pending`, and the tensors each
    name covers."""
    pending = Pending()
    keys = {"fresh_zero": sorted(st.fresh_zero), "grad_l2": sorted(st.total_norms),
            "carried": sorted(st.carried),
            "scalar_loss": isinstance(loss, torch.Tensor) and loss.numel() == 1}
    with torch.no_grad():
        obs.probe.end(pending)
        pending.add("fresh_l2", [])
        for _, part in st.fresh_norms:
            pending.add("fresh_l2", part)
        pending.add("fresh_zero", [st.fresh_zero[k] for k in keys["fresh_zero"]])
        pending.add("grad_l2", [st.total_norms[k] for k in keys["grad_l2"]])
        pending.add("carried", [st.carried[k] for k in keys["carried"]])
        pending.add("resets", [v for v in st.resets.values() if v is not None])
        pending.add("rewrites", rewrites.queued(st))
        pending.add("checksum", _checksums(obs) if obs.checksums else [])
        # The loss rides along with the step's one read-back instead of its own sync.
        pending.add("loss", [loss.detach().reshape(()).float()] if keys["scalar_loss"]
                    else [])
    return pending, keys


def _checksums(obs) -> list[torch.Tensor]:
    """Each fingerprinted tensor's value checksum: the probe's where its pass took it (the
    same number), else taken here."""
    taken = obs.probe.checksums
    return [taken[k] if k in taken else checksum(obs.local[k])
            for k in obs.shards.fingerprinted]


def resolve(obs, st: StepState, got: dict, keys: dict) -> Resolved:
    """The step's values from its read-back `got` (`keys`: what `queue` said each name
    covers): the probe's change, the fresh and total gradient norms, what was carried; the
    sharded tensors' rows made the whole tensors' on every rank."""
    n = obs.n
    delta, changed, ratio = obs.probe.resolve(got)
    merged, stale = merged_skips(st, got["fresh_l2"], got["resets"])
    grad_norm, nonfinite, zero_now = resolve_fresh(
        st, got["fresh_l2"], dict(zip(keys["fresh_zero"], got["fresh_zero"])), n, stale)
    skipping = obs.holdings.skipping(st)
    grad_total = _grad_total(st, got, keys, grad_norm, n)
    carried_grad = np.zeros(n, dtype=bool)
    carried_grad[keys["carried"]] = got["carried"] != 0  # NaN != 0: a NaN .grad is carried
    if obs.shards:  # every rank, every step: the whole tensors' values from the shards'
        obs.shards.combine({
            "delta": delta, "value": obs.probe.value_norm, "grad": grad_norm,
            "total": grad_total, "changed": changed, "used": st.used, "ratio": ratio,
            "nonfinite": nonfinite, "carried": carried_grad, "checksum": got["checksum"]})
    return Resolved(delta, changed, ratio, grad_norm, grad_total, nonfinite, carried_grad,
                    zero_now, skipping, merged)


def _grad_total(st: StepState, got: dict, keys: dict, grad_norm: np.ndarray,
                n: int) -> np.ndarray:
    """The norm of the .grad each optimizer stepped on: read at its step, or the fresh norm
    where nothing rewrote .grad since backward (`st.total_is_fresh`), scaled where an
    unscaling rewrote it without a version bump (`rewrites`: `st.rewritten`)."""
    grad_total = np.full(n, np.nan)
    grad_total[keys["grad_l2"]] = got["grad_l2"]
    same = (np.concatenate(st.total_is_fresh) if st.total_is_fresh
            else np.zeros(0, dtype=np.int64))
    grad_total[same] = grad_norm[same]
    st.rewritten = rewrites.correct(st, got["rewrites"], grad_norm, grad_total, same)
    return grad_total
