"""Observe real training steps: the only module that touches torch hooks.

Per step and tensor it records what SPEC 2.3 defines (used, fresh and total gradient norms, a
carried-over `.grad`, exact change). Work is batched across tensors with foreach kernels and
read back to the host once per step and device, never once per tensor, so observation stays
cheap on an accelerator. Hooks live only between `attach()` and `detach()`; callers pair them
in `try/finally`.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
import weakref
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from .inventory import Inventory, group_lr
from .schema import STEPS_COLUMNS

_INF = float("inf")


@dataclasses.dataclass
class StepFailure:
    """The user's step raised: which step, and what, so earlier steps can still be shown."""

    step: int
    error: str
    traceback: str


class Recorder:
    def __init__(self, inventory: Inventory, optimizers: list[torch.optim.Optimizer],
                 checksums: bool = False, on_progress: Callable | None = None):
        self.inv = inventory
        self.checksums = checksums  # a value fingerprint per tensor and step, to compare ranks
        self.on_progress = on_progress  # on_progress(event, step, recorder): a watchdog's feed
        self.tensors = inventory.tensors
        self.optimizers = optimizers
        self.n = len(self.tensors)
        self._handles: list = []
        self._active = False
        self._records: list[dict[str, np.ndarray]] = []
        self.losses: list[float] = []
        # Tensors the foreach fast path can diff; others (integer, bool) are compared one by one.
        self._float_idx = [k for k, t in enumerate(self.tensors) if t.is_floating_point()]
        self._other_idx = [k for k, t in enumerate(self.tensors) if not t.is_floating_point()]
        # Which tensors each optimizer holds: their .grad is read when that optimizer steps.
        self._held_by = [[k for k, row in enumerate(inventory.rows)
                          if any(i == o for o, _ in row["memberships"])]
                         for i in range(len(optimizers))]
        self._before: list[torch.Tensor] = []
        self._fresh: dict[int, torch.Tensor] = {}

    # ----------------------------------------------------------------- hooks
    def attach(self) -> None:
        self._before = [torch.empty_like(t, memory_format=torch.preserve_format)
                        for t in self.tensors]
        for k, t in enumerate(self.tensors):
            self._hook_tensor(k, t)
        for i, opt in enumerate(self.optimizers):
            self._handles.append(opt.register_step_pre_hook(self._optimizer_hook(i)))

    def detach(self) -> None:
        self._active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._before = []
        self._fresh = {}

    def _hook_tensor(self, k: int, t: torch.Tensor) -> None:
        """Hook every tensor, frozen ones too: a tensor unfrozen mid-run must be observed."""
        was = t.requires_grad
        try:
            if not was:
                t.requires_grad_(True)
            self._handles.append(t.register_hook(self._pre_hook(k)))
            self._handles.append(t.register_post_accumulate_grad_hook(self._post_hook(k)))
        except RuntimeError:  # not a leaf we can hook: observed through values only
            pass
        finally:
            if not was:
                t.requires_grad_(False)

    def _pre_hook(self, k: int) -> Callable:
        def hook(grad):
            if not self._active:
                return None
            if not self._backward_queued:
                if not self._touched and self.on_progress is not None:
                    self.on_progress("backward", len(self._records), self)
                # Measure this backward's gradients when it ends: after every accumulation,
                # before anything (clipping, unscaling) rewrites .grad in place.
                self._backward_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._touched.add(k)
            if not self._seen[k]:
                self._seen[k] = True
                current = self.tensors[k].grad
                if current is not None:
                    # Landing on an existing .grad: keep this step's own gradient apart.
                    self._carried[k] = _max_abs(current)
                    self._fresh[k] = grad
            elif k in self._fresh:
                self._fresh[k] = self._fresh[k] + grad
            return None
        return hook

    def _post_hook(self, k: int) -> Callable:
        def hook(_tensor):
            if self._active:
                self._used[k] = True
        return hook

    def _on_backward_end(self) -> None:
        self._backward_queued = False
        touched, self._touched = sorted(self._touched), set()
        own = [(k, self._fresh[k] if k in self._fresh else self.tensors[k].grad) for k in touched]
        own = [(k, g) for k, g in own if g is not None]
        with torch.no_grad():
            l2 = _norms([g for _, g in own], 2)
            mx = _norms([g for _, g in own], _INF)
        for (k, g), a, b in zip(own, l2, mx):
            self._fresh_norms[k] = (a, b)
            if k not in self._fresh:  # measured on .grad itself: reusable if left untouched
                self._measured_grad[k] = (weakref.ref(g), g._version)

    def _optimizer_hook(self, i: int) -> Callable:
        def hook(*_args):
            if self._active:
                self._snapshot(self._held_by[i])
        return hook

    # ----------------------------------------------------------------- steps
    def begin_step(self) -> None:
        n = self.n
        self._used = [False] * n
        self._seen = [False] * n
        self._snapped = [False] * n
        self._touched: set[int] = set()
        self._backward_queued = False
        self._carried: dict[int, torch.Tensor] = {}
        self._fresh = {}
        self._fresh_norms: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._measured_grad: dict[int, tuple[weakref.ref, int]] = {}
        self._requires_grad = np.zeros(n, dtype=bool)
        self._lr = np.full(n, math.nan)
        self._device_values: dict[str, list[tuple[int, torch.Tensor]]] = {
            "grad_l2": [], "grad_max": [], "fresh_l2": [], "fresh_max": []}
        with torch.no_grad():
            self._before_norm = _norms([self.tensors[k] for k in self._float_idx], 2)
            _copy_all(self._before, self.tensors)
        self._active = True
        if self.on_progress is not None:
            self.on_progress("begin", len(self._records), self)

    def abort_step(self) -> None:
        """The user's step raised: drop its partial observations."""
        self._active = False
        self._fresh = {}

    def end_step(self, loss=None) -> None:
        self._snapshot(range(self.n))  # what no optimizer stepped: as it stands now
        self._active = False
        with torch.no_grad():
            f_before = [self._before[k] for k in self._float_idx]
            f_now = [self.tensors[k] for k in self._float_idx]
            if f_before:
                torch._foreach_sub_(f_before, f_now)  # before <- before - after, no allocation
            delta_l2 = _norms(f_before, 2)
            delta_max = _norms(f_before, _INF)
            other_changed = [torch.ne(self._before[k], self.tensors[k]).any()
                             for k in self._other_idx]
            sums = [_fingerprint(t) for t in self.tensors] if self.checksums else []
        self._store(delta_l2, delta_max, other_changed, sums)
        self._fresh = {}
        if loss is not None:
            self.losses.append(_as_float(loss))
        if self.on_progress is not None:
            self.on_progress("end", len(self._records) - 1, self)

    def _snapshot(self, indices) -> None:
        """What an optimizer sees as it steps: requires_grad, lr and .grad of what it holds."""
        idx = [k for k in indices if not self._snapped[k]]
        if not idx:
            return
        for k in idx:
            self._snapped[k] = True
            t = self.tensors[k]
            self._requires_grad[k] = t.requires_grad
            group = self.inv.first_group[k]
            if group is not None:
                self._lr[k] = group_lr(self.optimizers[group[0]].param_groups[group[1]])
        with torch.no_grad():
            grad_idx = [k for k in idx if self.tensors[k].grad is not None]
            # A .grad nothing rewrote since backward ended (no clipping, no unscaling) already
            # has its norms: skip two passes over it.
            reused = {k: self._fresh_norms[k] for k in grad_idx if self._untouched(k)}
            todo = [k for k in grad_idx if k not in reused]
            grads = [self.tensors[k].grad for k in todo]
            values = self._device_values
            values["grad_l2"] += zip(todo, _norms(grads, 2))
            values["grad_max"] += zip(todo, _norms(grads, _INF))
            values["grad_l2"] += [(k, pair[0]) for k, pair in reused.items()]
            values["grad_max"] += [(k, pair[1]) for k, pair in reused.items()]
        for k in idx:
            if k in self._fresh_norms:
                l2, mx = self._fresh_norms.pop(k)
                values["fresh_l2"].append((k, l2))
                values["fresh_max"].append((k, mx))
            self._fresh.pop(k, None)

    def _untouched(self, k: int) -> bool:
        source = self._measured_grad.get(k)
        grad = self.tensors[k].grad
        return (source is not None and k in self._fresh_norms and source[0]() is grad
                and grad._version == source[1])

    def _store(self, delta_l2, delta_max, other_changed, sums) -> None:
        keyed = list(self._device_values.items()) + [("carried", list(self._carried.items()))]
        parts = [self._before_norm, delta_l2, delta_max, other_changed, sums] + [
            [v for _, v in pairs] for _, pairs in keyed]
        flat = _readback([x for part in parts for x in part])
        chunks = np.split(flat, np.cumsum([len(p) for p in parts])[:-1])
        before_norm, d_l2, d_max, other_ch, checksum = chunks[:5]

        n = self.n
        per_tensor = {}
        for (name, pairs), chunk in zip(keyed, chunks[5:]):
            column = np.full(n, np.nan)
            column[[k for k, _ in pairs]] = chunk
            per_tensor[name] = column
        used = np.array(self._used, dtype=bool)
        has_fresh = used & ~np.isnan(per_tensor["fresh_l2"])  # NaN here means "none"
        has_fresh[[k for k, _ in self._device_values["fresh_max"]]] = True
        has_fresh &= used
        grad_l2 = np.where(has_fresh, per_tensor["fresh_l2"], np.nan)
        grad_max = np.where(has_fresh, per_tensor["fresh_max"], np.nan)

        delta = np.zeros(n)
        changed = np.zeros(n, dtype=bool)
        ratio = np.full(n, np.nan)
        f_idx = self._float_idx
        delta[f_idx] = d_l2
        changed[f_idx] = d_max != 0
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio[f_idx] = np.where(before_norm > 0, d_l2 / before_norm, np.nan)
        changed[self._other_idx] = other_ch != 0
        # Non-finite values (a -inf mask, a NaN) make before - after NaN without any change:
        # decide those few tensors element by element.
        for j in np.flatnonzero(np.isnan(d_max)):
            k = f_idx[j]
            changed[k], delta[k] = _nonfinite_change(self._before[k], self.tensors[k],
                                                     before_had_nan=bool(np.isnan(before_norm[j])))

        self._records.append({
            "requires_grad": self._requires_grad,
            "used": used,
            "grad_norm": grad_l2,
            "grad_max": grad_max,
            "grad_total_norm": per_tensor["grad_l2"],
            "carried_grad": np.nan_to_num(per_tensor["carried"], nan=0.0) != 0,
            "delta_norm": delta,
            "update_ratio": ratio,
            "changed": changed,
            "lr": self._lr,
            "nonfinite": has_fresh & ~np.isfinite(grad_max),
            **({"checksum": checksum} if self.checksums else {}),
        })

    # ----------------------------------------------------------------- result
    def steps_table(self) -> pd.DataFrame:
        names = self.inv.names
        count = len(self._records)
        data = {"step": np.repeat(np.arange(count, dtype=np.int64), self.n),
                "name": np.tile(np.array(names, dtype=object), count)}
        columns = list(STEPS_COLUMNS) + (["checksum"] if self.checksums else [])
        for col in columns[2:]:
            data[col] = (np.concatenate([r[col] for r in self._records]) if count
                         else np.array([], dtype=bool if col in _BOOL_COLS else float))
        return pd.DataFrame(data, columns=columns)

    def step_table(self, step: int) -> pd.DataFrame:
        """The rows of one recorded step (what a watchdog writes out as the run goes)."""
        record = self._records[step]
        data = {"step": np.full(self.n, step, dtype=np.int64),
                "name": np.array(self.inv.names, dtype=object), **record}
        return pd.DataFrame(data, columns=list(data))


_BOOL_COLS = {"requires_grad", "used", "carried_grad", "changed", "nonfinite"}


def run_steps(recorder: Recorder, step_fn: Callable[[int], object], steps: int) -> StepFailure | None:
    """Run `steps` observed steps; stop at the first failure and report it."""
    for step in range(steps):
        recorder.begin_step()
        try:
            loss = step_fn(step)
        except Exception as exc:  # the user's code: keep earlier steps, report this one
            recorder.abort_step()
            return StepFailure(step=step, error=f"{type(exc).__name__}: {exc}",
                               traceback=traceback.format_exc())
        recorder.end_step(loss)
    return None


# --------------------------------------------------------------------- kernels
def _norms(tensors: list[torch.Tensor], ord: float) -> list[torch.Tensor]:
    """Float32 norms as 0-d device tensors, batched; per tensor only where foreach can't."""
    if not tensors:
        return []
    try:
        return list(torch._foreach_norm(tensors, ord, dtype=torch.float32))
    except (RuntimeError, TypeError, NotImplementedError):
        return [torch.linalg.vector_norm(_dense(t).float(), ord) for t in tensors]


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.coalesce().values() if t.is_sparse else t


def _max_abs(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(_dense(t).float(), _INF)


def _copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    try:
        torch._foreach_copy_(dst, src)
    except (RuntimeError, TypeError, NotImplementedError):
        for d, s in zip(dst, src):
            d.copy_(s)


def _nonfinite_change(delta: torch.Tensor, after: torch.Tensor,
                      before_had_nan: bool) -> tuple[bool, float]:
    """Exact change for a tensor whose `before - after` holds NaN.

    NaN arises from inf - inf of the same sign (unchanged) or from a NaN operand. Without a NaN
    before the step, a NaN position changed exactly when the value is NaN now. With NaNs on
    both sides, a position that is NaN both before and after counts as unchanged.
    """
    nan = torch.isnan(delta)
    changed = bool(((delta != 0) & ~nan).any()) or (
        not before_had_nan and bool((nan & torch.isnan(after)).any()))
    norm = float(torch.linalg.vector_norm(torch.where(nan, 0.0, delta.float())))
    return changed, norm


def _fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Sum and sum of squares in float64, folded: equal values give equal fingerprints, and
    ranks whose copies differ almost never collide."""
    x = t.detach().to(torch.float64)
    return x.sum() + x.square().sum() * math.sqrt(2.0)


def _readback(values: list) -> np.ndarray:
    """One host transfer per device (and dtype) for all of a step's scalars."""
    out = np.empty(len(values), dtype=np.float64)
    groups: dict[tuple, list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault((v.device, v.dtype), []).append(i)
    for idx in groups.values():
        out[idx] = torch.stack([values[i] for i in idx]).cpu().numpy()
    return out


def _as_float(loss) -> float:
    try:
        return float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return math.nan
