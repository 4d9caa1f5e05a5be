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
import operator
import traceback
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from .delta import DEFAULT_SAMPLE, make_probe
from .inventory import Inventory, group_lr
from .kernels import Buckets, Layout, Pending, checksum, exact_norm, max_abs, norms
from .schema import STEPS_COLUMNS


@dataclasses.dataclass
class StepFailure:
    """The user's step raised: which step, and what, so earlier steps can still be shown."""

    step: int
    error: str
    traceback: str


class Recorder:
    def __init__(self, inventory: Inventory, optimizers: list[torch.optim.Optimizer],
                 checksums: bool = False, on_progress: Callable | None = None,
                 delta: str = "exact", sample: int = DEFAULT_SAMPLE,
                 grads_untouched_until_step: bool = False, held_grads_start_none: bool = False):
        """The last two say what the caller's loop guarantees (`api.loop_facts`); each lets
        the recorder skip work that a hand-written `train_step` would need.

        `grads_untouched_until_step`: nothing runs between backward and `optimizer.step()`
        (no clipping, unscaling, accumulation), so every .grad measured when backward ended is
        what the optimizer sees, unchecked. `held_grads_start_none`: each optimizer's
        `zero_grad(set_to_none=True)` runs right before the step's one backward and no process
        group reduces gradients, so a tensor an optimizer holds was reached by autograd exactly
        when its .grad is set as the optimizer steps: it needs no hook (one Python call per
        tensor per backward was a large part of observing models with many small tensors).
        """
        self.inv = inventory
        self.checksums = checksums  # a value fingerprint per tensor and step, to compare ranks
        self.on_progress = on_progress  # on_progress(event, step, recorder): a watchdog's feed
        self.tensors = inventory.tensors
        self.optimizers = optimizers
        self.n = len(self.tensors)
        self._handles: list = []
        self._active = False
        self._records: list[dict[str, np.ndarray]] = []
        self._step_ids: list[int] = []
        self.losses: list[float] = []
        # Which tensors each optimizer holds: their .grad is read when that optimizer steps.
        self._held_by = [np.array([k for k, row in enumerate(inventory.rows)
                                   if any(i == o for o, _ in row["memberships"])], dtype=np.int64)
                         for i in range(len(optimizers))]
        # The (optimizer, param group) pairs whose lr is read, and each tensor's pair.
        self._opt_groups = sorted({g for g in inventory.first_group if g is not None})
        self._group_of = np.array([-1 if g is None else self._opt_groups.index(g)
                                   for g in inventory.first_group], dtype=np.int64)
        held = {int(k) for ks in self._held_by for k in ks}
        likely_static = {k for k, t in enumerate(self.tensors)
                         if not t.requires_grad or k not in held}
        self.probe = make_probe(delta, self.tensors, likely_static, sample)
        self._zero_grad_expected: set[int] = set()
        self._grad_buckets = Buckets(self.tensors)
        self._everything = Layout(list(range(self.n)), self._grad_buckets)  # for hooked backwards
        self.grads_untouched_until_step = grads_untouched_until_step
        # Tensors observed without a hook, each in the share of the first optimizer holding it
        # (the standard loop steps them in order): `used` and the fresh gradient come from .grad.
        self._unhooked = np.zeros(self.n, dtype=bool)
        self._shares: list[_Share | None] = [None] * len(optimizers)
        if held_grads_start_none and grads_untouched_until_step:
            for i, ks in enumerate(self._held_by):
                mine = ks[~self._unhooked[ks]]
                self._unhooked[mine] = True
                if len(mine):
                    self._shares[i] = _Share(mine, self.tensors, self._grad_buckets,
                                             self._group_of)
        self._all = np.arange(self.n)
        self._fresh: dict[int, torch.Tensor] = {}

    # ----------------------------------------------------------------- hooks
    def attach(self) -> None:
        self.probe.attach()
        for k, t in enumerate(self.tensors):
            if not self._unhooked[k]:
                self._hook_tensor(k, t)
        for i, opt in enumerate(self.optimizers):
            self._handles.append(opt.register_step_pre_hook(self._optimizer_hook(i)))

    def detach(self) -> None:
        self._active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.probe.detach()
        self._grad_buckets.clear()
        self._fresh = {}

    def _hook_tensor(self, k: int, t: torch.Tensor) -> None:
        """Hook every tensor, frozen ones too: a tensor unfrozen mid-run must be observed.

        One hook per tensor: it fires as autograd accumulates into the leaf, which is what
        `used` means (and what DDP watches). Fewer Python calls per backward is most of what
        keeps models with thousands of small tensors cheap to observe.
        """
        was = t.requires_grad
        try:
            if not was:
                t.requires_grad_(True)
            self._handles.append(t.register_hook(self._pre_hook(k)))
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
                    self.on_progress("backward", self._step, self)
                # Measure this backward's gradients when it ends: after every accumulation,
                # before anything (clipping, unscaling) rewrites .grad in place.
                self._backward_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._touched.add(k)
            if not self._used[k]:
                self._used[k] = True
                current = self.tensors[k].grad
                if current is not None:
                    # Landing on an existing .grad: keep this step's own gradient apart.
                    self._carried[k] = max_abs(current)
                    self._fresh[k] = grad
            elif k in self._fresh:
                self._fresh[k] = self._fresh[k] + grad
            return None
        return hook

    def _on_backward_end(self) -> None:
        self._backward_queued = False
        touched, self._touched = list(self._touched), set()
        fresh, tensors = self._fresh, self.tensors
        own = dict(zip(touched, [tensors[k].grad for k in touched]))
        on_grad = [k for k in touched if k not in fresh] if fresh else touched
        if fresh:
            own.update((k, fresh[k]) for k in touched if k in fresh)
        if any(g is None for g in own.values()):
            own = {k: g for k, g in own.items() if g is not None}
            on_grad = [k for k in on_grad if k in own]
        self._measure_fresh(self._everything, [own.get(k) for k in range(self.n)])
        # Measured on .grad itself: reusable at optimizer time if nothing rewrote it.
        self._measured[on_grad] = True
        if not self.grads_untouched_until_step:
            self._measured_grad.update((k, (own[k], own[k]._version)) for k in on_grad)

    def _take_share(self, share: "_Share") -> None:
        """An optimizer's unhooked tensors as it steps: each .grad is this step's own.

        Laid out once (`_Share`) so a step touches each tensor's Python object once: right
        after a backward those objects are out of the CPU's caches, and every per-tensor pass
        over them cost as much as a kernel.
        """
        idx = share.idx
        grads, flags = share.read()
        present = np.fromiter([g is not None for g in grads], dtype=bool, count=len(grads))
        self._snapped[idx] = True
        self._requires_grad[idx] = flags
        self._used[idx] = present
        if len(share.lr_rows):
            self._lr[share.lr_rows] = self._group_lrs()[share.lr_groups]
        self._measure_fresh(share.layout, grads)
        self._grad_same.append(idx[present])  # nothing rewrote .grad: its norm is the fresh one

    def _measure_fresh(self, layout: Layout, grads: list) -> None:
        """Queue the norms of one backward's gradients (`grads` at `layout`'s positions, None
        where there is none), and an exact-zero check where a zero is expected."""
        with torch.no_grad():
            self._fresh_parts += layout.norms(grads)
            for k in self._zero_grad_expected:
                g = layout.get(grads, k)
                if g is not None:
                    self._fresh_zero[k] = max_abs(g)  # confirm an exact zero in the same read
        self._fresh_src.append((layout, grads))

    def _optimizer_hook(self, i: int) -> Callable:
        share = self._shares[i]
        # Held tensors outside the share: those an earlier optimizer holds too.
        rest = self._held_by[i] if share is None else np.setdiff1d(self._held_by[i], share.idx)

        def hook(*_args):
            if self._active:
                if share is not None and not self._snapped[share.first]:
                    self._take_share(share)
                if len(rest):
                    self._snapshot(rest)
        return hook

    # ----------------------------------------------------------------- steps
    def begin_step(self, step: int | None = None, consecutive: bool = False) -> None:
        """Start observing a step. `consecutive`: nothing ran since the last `end_step`."""
        n = self.n
        self._step = len(self._records) if step is None else step
        self._used = np.zeros(n, dtype=bool)
        self._snapped = np.zeros(n, dtype=bool)
        self._touched: set[int] = set()
        self._backward_queued = False
        self._carried: dict[int, torch.Tensor] = {}
        self._fresh = {}
        self._fresh_parts: list[tuple[list[int], object]] = []
        # Each backward's gradients as measured (layout, values), to look at one again if its
        # norm comes out 0 or non-finite.
        self._fresh_src: list[tuple[Layout, list]] = []
        self._fresh_zero: dict[int, torch.Tensor] = {}
        self._measured_grad: dict[int, tuple[torch.Tensor, int]] = {}
        self._measured = np.zeros(n, dtype=bool)
        self._requires_grad = np.zeros(n, dtype=bool)
        self._lr = np.full(n, math.nan)
        self._grad_l2: dict[int, torch.Tensor] = {}
        self._grad_same: list[np.ndarray] = []  # .grad norms equal to the fresh ones
        self.probe.begin(consecutive=consecutive)
        self._active = True
        if self.on_progress is not None:
            self.on_progress("begin", self._step, self)

    def abort_step(self) -> None:
        """The user's step raised: drop its partial observations."""
        self._active = False
        self._fresh = {}
        self._fresh_src = []
        self._measured_grad = {}

    def end_step(self, loss=None) -> None:
        if not self._snapped.all():
            self._snapshot(self._all)  # what no optimizer stepped: as it stands now
        self._active = False
        pending = Pending()
        with torch.no_grad():
            self.probe.end(pending)
            pending.add("fresh_l2", [])
            for _, part in self._fresh_parts:
                pending.add("fresh_l2", part)
            fresh = [ks for ks, _ in self._fresh_parts]
            zero_checked = sorted(self._fresh_zero)
            pending.add("fresh_zero", [self._fresh_zero[k] for k in zero_checked])
            total = sorted(self._grad_l2)
            pending.add("grad_l2", [self._grad_l2[k] for k in total])
            carried = sorted(self._carried)
            pending.add("carried", [self._carried[k] for k in carried])
            pending.add("checksum", [checksum(t) for t in self.tensors] if self.checksums else [])
            scalar_loss = isinstance(loss, torch.Tensor) and loss.numel() == 1
            # The loss rides along with the step's one read-back instead of its own sync.
            pending.add("loss", [loss.detach().reshape(()).float()] if scalar_loss else [])
        got = pending.read()
        delta, changed, ratio = self.probe.resolve(got)
        grad_norm, nonfinite = self._resolve_fresh(
            fresh, got["fresh_l2"], dict(zip(zero_checked, got["fresh_zero"])))

        n = self.n
        grad_total = np.full(n, np.nan)
        grad_total[total] = got["grad_l2"]
        same = np.concatenate(self._grad_same) if self._grad_same else self._all[:0]
        grad_total[same] = grad_norm[same]
        carried_grad = np.zeros(n, dtype=bool)
        carried_grad[carried] = got["carried"] != 0  # NaN != 0: a NaN .grad counts as carried
        self._records.append({
            "requires_grad": self._requires_grad,
            "used": self._used,
            "grad_norm": grad_norm,
            "grad_total_norm": grad_total,
            "carried_grad": carried_grad,
            "delta_norm": delta,
            "update_ratio": ratio,
            "changed": changed,
            "lr": self._lr,
            "nonfinite": nonfinite,
            **({"checksum": got["checksum"]} if self.checksums else {}),
        })
        self._step_ids.append(self._step)
        self._fresh = {}
        self._fresh_src = []
        self._measured_grad = {}
        if scalar_loss:
            self.losses.append(float(got["loss"][0]))
        elif loss is not None:
            self.losses.append(_as_float(loss))
        if self.on_progress is not None:
            self.on_progress("end", self._step, self)

    def _resolve_fresh(self, keys: list, values: np.ndarray, zero_checked: dict):
        """Fresh-gradient norms, exact at the edges: 0 only when every element is 0, and
        non-finite only when an element is. The float32 norm decides all other tensors."""
        n = self.n
        grad_norm = np.full(n, np.nan)
        nonfinite = np.zeros(n, dtype=bool)
        fresh = np.concatenate([np.asarray(ks, dtype=np.int64) for ks in keys]) if keys \
            else self._all[:0]
        l2 = np.asarray(values, dtype=np.float64)
        if len(self._fresh_src) > 1:  # a later backward of the same step supersedes
            _, first = np.unique(fresh[::-1], return_index=True)
            last = len(fresh) - 1 - first
            fresh, l2 = fresh[last], l2[last]
        zero_now = set()
        for j in np.flatnonzero(~(np.isfinite(l2) & (l2 > 0))):
            k = int(fresh[j])
            g = self._fresh_grad(k)
            mx = zero_checked[k] if k in zero_checked else float(max_abs(g))
            if not np.isfinite(mx):  # a NaN or Inf element: the norm stays NaN or inf
                nonfinite[k] = True
            else:
                l2[j] = 0.0 if mx == 0 else exact_norm(g)
                if l2[j] == 0:
                    zero_now.add(k)
        self._zero_grad_expected = zero_now
        grad_norm[fresh] = l2
        return grad_norm, nonfinite

    def _fresh_grad(self, k: int) -> torch.Tensor:
        """Tensor k's gradient of this step's last backward that reached it."""
        for layout, grads in reversed(self._fresh_src):
            g = layout.get(grads, k)
            if g is not None:
                return g
        raise KeyError(k)

    def _snapshot(self, indices: np.ndarray) -> None:
        """What an optimizer sees as it steps: requires_grad, lr and .grad of what it holds."""
        idx = indices[~self._snapped[indices]]
        if not len(idx):
            return
        self._snapped[idx] = True
        tensors = self.tensors
        ks = idx.tolist()
        self._requires_grad[idx] = [tensors[k].requires_grad for k in ks]
        self._set_lr(idx)
        if self.grads_untouched_until_step:  # measured at backward end: known to be there
            has_grad = self._measured[idx].copy()
            rest = np.flatnonzero(~has_grad)
            has_grad[rest] = [tensors[ks[j]].grad is not None for j in rest]
        else:
            has_grad = np.array([tensors[k].grad is not None for k in ks], dtype=bool)
        # A .grad nothing rewrote since backward ended (no clipping, no unscaling) already
        # has its norm: skip a pass over it.
        reusable = has_grad & self._measured[idx]
        if not self.grads_untouched_until_step:
            measured = self._measured_grad
            for j in np.flatnonzero(reusable):
                g, version = measured[ks[j]]
                reusable[j] = tensors[ks[j]].grad is g and g._version == version
        self._grad_same.append(idx[reusable])
        todo = idx[has_grad & ~reusable].tolist()
        with torch.no_grad():
            for k, v in zip(todo, norms([tensors[k].grad for k in todo])):
                self._grad_l2[k] = v

    def _set_lr(self, idx: np.ndarray) -> None:
        groups = self._group_of[idx]
        held = groups >= 0
        if held.any():
            self._lr[idx[held]] = self._group_lrs()[groups[held]]

    def _group_lrs(self) -> np.ndarray:
        """The lr of each (optimizer, param group) pair, as it is now."""
        return np.array([group_lr(self.optimizers[i].param_groups[j])
                         if j < len(self.optimizers[i].param_groups) else math.nan
                         for i, j in self._opt_groups])

    # ----------------------------------------------------------------- result
    def steps_table(self) -> pd.DataFrame:
        names = self.inv.names
        count = len(self._records)
        data = {"step": np.repeat(np.array(self._step_ids, dtype=np.int64), self.n),
                "name": np.tile(np.array(names, dtype=object), count)}
        columns = list(STEPS_COLUMNS) + (["checksum"] if self.checksums else [])
        for col in columns[2:]:
            data[col] = (np.concatenate([r[col] for r in self._records]) if count
                         else np.array([], dtype=bool if col in _BOOL_COLS else float))
        return pd.DataFrame(data, columns=columns)

    def step_table(self, step: int) -> pd.DataFrame:
        """The rows of one recorded step (what a watchdog writes out as the run goes)."""
        record = self._records[len(self._step_ids) - 1 - self._step_ids[::-1].index(step)]
        data = {"step": np.full(self.n, step, dtype=np.int64),
                "name": np.array(self.inv.names, dtype=object), **record}
        return pd.DataFrame(data, columns=list(data))


_BOOL_COLS = {"requires_grad", "used", "carried_grad", "changed", "nonfinite"}
_GRAD_AND_FLAG = operator.attrgetter("grad", "requires_grad")


class _Share:
    """An optimizer's unhooked tensors, with what a step needs laid out in advance: the tensor
    objects, their layout (positions, bucket groups) and the rows whose lr is read."""

    def __init__(self, idx: np.ndarray, tensors: list[torch.Tensor], buckets: Buckets,
                 group_of: np.ndarray):
        self.idx = idx
        self.first = int(idx[0])  # taken this step when this one is snapped
        self.layout = Layout(idx.tolist(), buckets)
        self.tensors = [tensors[k] for k in self.layout.ks]
        held = group_of[idx] >= 0
        self.lr_rows, self.lr_groups = idx[held], group_of[idx][held]

    def read(self) -> tuple[list, list]:
        """Every .grad and requires_grad, in one pass over the tensor objects."""
        pairs = list(map(_GRAD_AND_FLAG, self.tensors))
        return [g for g, _ in pairs], [f for _, f in pairs]


def run_steps(recorder: Recorder, step_fn: Callable[[int], object], steps: int,
              every: int = 1) -> StepFailure | None:
    """Run `steps` steps, observing steps 0, every, 2*every, ...; stop at the first failure.

    Between observed steps the hooks stay attached but idle, so a long run keeps a steps table
    of steps/every rows per tensor.
    """
    previous = None
    for step in range(steps):
        observed = step % every == 0
        if observed:
            recorder.begin_step(step, consecutive=previous == step - 1)
        try:
            loss = step_fn(step)
        except Exception as exc:  # the user's code: keep earlier steps, report this one
            if observed:
                recorder.abort_step()
            return StepFailure(step=step, error=f"{type(exc).__name__}: {exc}",
                               traceback=traceback.format_exc())
        if observed:
            recorder.end_step(loss)
            previous = step
    return None


def _as_float(loss) -> float:
    try:
        return float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return math.nan
