"""One forward and backward on the meta device, observed: which tensors autograd reached.

A meta tensor has a shape and a dtype but no values, so nothing here reads, copies or
allocates a tensor's contents: no snapshots, no norms, no probes. What one pass can tell is the
wiring: `requires_grad`, the optimizers' groups (the inventory) and which tensors autograd
accumulated a gradient into. `post_accumulate_grad` hooks fire on meta leaves as on real ones
(torch 2.x), so "used" means on meta exactly what it means in a real run.

    with MetaPass(inventory) as seen:
        loss.backward()
    seen.steps_table()

The hooks are removed, and every `.grad` put back as it was, when the block is left.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from ...core.schema import BOOL_STEP_COLUMNS, STEPS_COLUMNS
from .inventory import Inventory, group_lr
from .unregistered import Unregistered, with_unregistered


class MetaPass:
    """Records which of `inventory`'s tensors get a gradient while it is entered."""

    def __init__(self, inventory: Inventory, optimizers: list[torch.optim.Optimizer]):
        self.inv, self.tensors, self.optimizers = inventory, inventory.tensors, optimizers
        self.used = np.zeros(len(self.tensors), dtype=bool)
        self._handles: list = []
        self._grads: list = []
        # Leaves outside the inventory that autograd reached: found in the pass's graph.
        self.unregistered = Unregistered(inventory, meta=True)

    def __enter__(self) -> "MetaPass":
        self._grads = [t.grad for t in self.tensors]  # references only: meta .grads are free
        try:
            for k, t in enumerate(self.tensors):
                if t.requires_grad and t.is_leaf:
                    self._handles.append(t.register_post_accumulate_grad_hook(self._hook(k)))
            self.unregistered.attach(self._handles)
            self.unregistered.begin()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Remove every hook and put each `.grad` back (the pass's own are meta: dropped)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for t, grad in zip(self.tensors, self._grads):
            t.grad = grad
        self.unregistered.forget_grads()

    def found(self, loss) -> None:
        """The pass ended: find the unregistered leaves in its graph (from `loss`, and the
        model's outputs)."""
        self.unregistered.end(0, loss, self.used)

    @property
    def rows(self) -> list[dict]:
        """The inventory's rows, then the unregistered tensors the pass found."""
        return self.inv.rows + self.unregistered.rows

    def _hook(self, k: int):
        def hook(_tensor):
            self.used[k] = True
        return hook

    def reset(self) -> None:
        """Forget what a failed attempt recorded (before the pass is tried again)."""
        self.used[:] = False
        for t, grad in zip(self.tensors, self._grads):
            t.grad = grad
        self.unregistered.begin()  # forget the failed attempt's graph

    def steps_table(self) -> pd.DataFrame:
        """The pass as step 0 of the steps table: requires_grad, used and lr are measured;
        every value column is NaN (not measured), and its flags False (never guessed True,
        and no rule that reads them runs on meta)."""
        n = len(self.tensors)
        lr = np.full(n, np.nan)
        for k, pair in enumerate(self.inv.first_group):
            if pair is not None:
                lr[k] = group_lr(self.optimizers[pair[0]].param_groups[pair[1]])
        data = {"step": np.zeros(n, dtype=np.int64),
                "name": np.array(self.inv.names, dtype=object),
                "requires_grad": np.array([t.requires_grad for t in self.tensors], dtype=bool),
                "used": self.used.copy(), "lr": lr}
        for col in STEPS_COLUMNS:
            if col not in data:
                data[col] = (np.zeros(n, dtype=bool) if col in BOOL_STEP_COLUMNS
                             else np.full(n, np.nan))
        return with_unregistered(pd.DataFrame(data, columns=list(STEPS_COLUMNS)),
                                 self.unregistered.table())


def off_meta(tensors: list[torch.Tensor]) -> list[str]:
    """The names of the devices other than meta that `tensors` live on (empty: all on meta)."""
    return sorted({str(t.device) for t in tensors if t.device.type != "meta"})


def batch_to_meta(batch, ids_too: bool = False):
    """`batch` with its floating tensors moved to meta (no values to keep), its integer and
    bool tensors (token ids, masks) left as they are unless `ids_too`. Walks dicts (and other
    mappings, as dicts), lists and tuples (namedtuples kept); anything else is left alone."""
    if isinstance(batch, torch.Tensor):
        keep = not ids_too and not (batch.is_floating_point() or batch.is_complex())
        return batch if keep or batch.device.type == "meta" else batch.to("meta")
    if isinstance(batch, Mapping):
        return {k: batch_to_meta(v, ids_too) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(batch_to_meta(v, ids_too) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(batch_to_meta(v, ids_too) for v in batch)
    return batch


def has_real_tensor(batch) -> bool:
    """Whether `batch` holds a tensor not on meta (what `ids_too` would still move)."""
    if isinstance(batch, torch.Tensor):
        return batch.device.type != "meta"
    if isinstance(batch, Mapping):
        return any(has_real_tensor(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return any(has_real_tensor(v) for v in batch)
    return False
