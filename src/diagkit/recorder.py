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
    def __init__(self, inventory: Inventory, optimizers: list[torch.optim.Optimizer]):
        self.inv = inventory
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
        self._before: list[torch.Tensor] = []

    # ----------------------------------------------------------------- hooks
    def attach(self) -> None:
        self._before = [torch.empty_like(t, memory_format=torch.preserve_format)
                        for t in self.tensors]
        for k, t in enumerate(self.tensors):
            self._hook_tensor(k, t)
        for opt in self.optimizers:
            self._handles.append(opt.register_step_pre_hook(self._on_optimizer_step))

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

    def _on_optimizer_step(self, *_args):
        if self._active and self._snap is None:
            self._snapshot()

    # ----------------------------------------------------------------- steps
    def begin_step(self) -> None:
        self._used = [False] * self.n
        self._seen = [False] * self.n
        self._carried: dict[int, torch.Tensor] = {}
        self._fresh: dict[int, torch.Tensor] = {}
        self._snap = None
        with torch.no_grad():
            self._before_norm = _norms([self.tensors[k] for k in self._float_idx], 2)
            _copy_all(self._before, self.tensors)
        self._active = True

    def abort_step(self) -> None:
        """The user's step raised: drop its partial observations."""
        self._active = False
        self._fresh = {}

    def end_step(self, loss=None) -> None:
        if self._snap is None:
            self._snapshot()
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
        self._store(delta_l2, delta_max, other_changed)
        self._fresh = {}
        if loss is not None:
            self.losses.append(_as_float(loss))

    def _snapshot(self) -> None:
        """What the optimizer sees: requires_grad, lr and .grad, at its step (or step end)."""
        with torch.no_grad():
            grad_idx = [k for k, t in enumerate(self.tensors) if t.grad is not None]
            grads = [self.tensors[k].grad for k in grad_idx]
            fresh_idx = list(self._fresh)
            fresh = [self._fresh[k] for k in fresh_idx]
            self._snap = {
                "requires_grad": np.array([t.requires_grad for t in self.tensors], dtype=bool),
                "lr": np.array([group_lr(self.optimizers[g[0]].param_groups[g[1]]) if g else math.nan
                                for g in self.inv.first_group], dtype=float),
                "grad_idx": grad_idx,
                "grad_l2": _norms(grads, 2),
                "grad_max": _norms(grads, _INF),
                "fresh_idx": fresh_idx,
                "fresh_l2": _norms(fresh, 2),
                "fresh_max": _norms(fresh, _INF),
                "carried_idx": list(self._carried),
                "carried": list(self._carried.values()),
            }
        self._fresh = {}

    def _store(self, delta_l2, delta_max, other_changed) -> None:
        snap = self._snap
        parts = [self._before_norm, delta_l2, delta_max, snap["grad_l2"], snap["grad_max"],
                 snap["fresh_l2"], snap["fresh_max"], snap["carried"], other_changed]
        flat = _readback([x for part in parts for x in part])
        sizes = [len(p) for p in parts]
        (before_norm, d_l2, d_max, g_l2, g_max, f_l2, f_max, carried_max,
         other_ch) = np.split(flat, np.cumsum(sizes)[:-1])

        n = self.n
        used = np.array(self._used, dtype=bool)
        total_l2 = np.full(n, np.nan)
        total_max = np.full(n, np.nan)
        total_l2[snap["grad_idx"]] = g_l2
        total_max[snap["grad_idx"]] = g_max
        # A step's own gradient is the whole .grad unless it landed on an existing one.
        grad_l2 = np.where(used, total_l2, np.nan)
        grad_max = np.where(used, total_max, np.nan)
        grad_l2[snap["fresh_idx"]] = f_l2
        grad_max[snap["fresh_idx"]] = f_max
        carried = np.zeros(n, dtype=bool)
        carried[snap["carried_idx"]] = carried_max != 0

        delta = np.zeros(n)
        changed = np.zeros(n, dtype=bool)
        ratio = np.full(n, np.nan)
        f_idx = self._float_idx
        delta[f_idx] = d_l2
        changed[f_idx] = d_max != 0
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio[f_idx] = np.where(before_norm > 0, d_l2 / before_norm, np.nan)
        changed[self._other_idx] = other_ch != 0

        has_fresh = np.zeros(n, dtype=bool)  # NaN in grad_max may be a NaN gradient, not "none"
        has_fresh[snap["grad_idx"]] = True
        has_fresh &= used
        has_fresh[snap["fresh_idx"]] = True
        self._records.append({
            "requires_grad": snap["requires_grad"],
            "used": used,
            "grad_norm": grad_l2,
            "grad_max": grad_max,
            "grad_total_norm": total_l2,
            "carried_grad": carried,
            "delta_norm": delta,
            "update_ratio": ratio,
            "changed": changed,
            "lr": snap["lr"],
            "nonfinite": has_fresh & ~np.isfinite(grad_max),
        })
        self._snap = None

    # ----------------------------------------------------------------- result
    def steps_table(self) -> pd.DataFrame:
        names = self.inv.names
        count = len(self._records)
        data = {"step": np.repeat(np.arange(count, dtype=np.int64), self.n),
                "name": np.tile(np.array(names, dtype=object), count)}
        for col in list(STEPS_COLUMNS)[2:]:
            data[col] = (np.concatenate([r[col] for r in self._records]) if count
                         else np.array([], dtype=bool if col in _BOOL_COLS else float))
        return pd.DataFrame(data, columns=list(STEPS_COLUMNS))


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


def _readback(values: list) -> np.ndarray:
    """One host transfer per device for all of a step's scalars."""
    out = np.empty(len(values), dtype=np.float64)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(v.device, []).append(i)
    for idx in by_device.values():
        stacked = torch.stack([values[i].to(torch.float32) for i in idx]).cpu().numpy()
        out[idx] = stacked
    return out


def _as_float(loss) -> float:
    try:
        return float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return math.nan
