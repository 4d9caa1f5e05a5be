"""Tensors that train nowhere: leaves that get gradients but are outside `.parameters()`.

A module kept in a plain Python list, or a plain `torch.randn(..., requires_grad=True)`
attribute, requires grad and receives gradients through the loss, yet `model.parameters()`,
`state_dict()`, the optimizer and DDP never see it. Only the autograd graph does: every leaf
that receives a gradient is an `AccumulateGrad` node reachable from the loss.

The graph is walked (one pass over its nodes) on the first observed step, then only on a step
whose set of used inventory tensors differs from the last walk's (a cheap signature of the
graph: a data-dependent branch may bring new leaves), or while a leaf of an earlier step is
still alive. Its roots: the loss `end_step` is given (if it has a `grad_fn`) and the outputs of
the model's forward calls during the step (a forward hook on the module the loop calls: how
`watch`, which never sees the loss, finds them; it does nothing where dynamo traces it).

Not counted: the inventory's tensors (the model's and the optimizers'), tensors the model's
forward is called with (its arguments: inputs, which may require grad on purpose, as for
saliency maps or adversarial examples), and every tensor made during the step: only state is
unregistered (`step_graph.Persistence`: on the model before observing began, or the same
object reached again on a later step). A tensor found is named by where it lives among
the model's plain attributes (`cells[0].weight_ih`, `mem_keys`, `memory['keys']`), else
`<unregistered #k shape dtype>`. From the step after it was found it is measured like any
tensor (used by a post-accumulate hook, norms, change); its discovery step records it used,
with its `.grad` norm as both norms, not carried, and no change measured (NaN, False).
"""

from __future__ import annotations

import itertools
import time
import warnings

import numpy as np
import pandas as pd
import torch

from ...core.schema import BOOL_STEP_COLUMNS, STEPS_COLUMNS
from .attribute_paths import find_paths
from .hook_ref import ModuleHook
from ..batched.kernels import checksum
from .step_graph import Persistence, graph_leaves, nested_tensors

_ROOTS = 16  # outputs of one forward taken as roots of the graph


class Unregistered:
    """Finds the unregistered leaves of observed steps and measures them from then on
    (owned by an `Observer`, or by a `MetaPass` with `meta=True`: no values read)."""

    def __init__(self, inventory, checksums: bool = False, meta: bool = False, entry=None):
        self.model = getattr(inventory, "model", None)
        # The module whose forward hook sees the outputs: the one the loop calls, which runs
        # eagerly (a `torch.compile` wrapper, not the module it compiles).
        self.entry = self.model if entry is None else entry
        self.persistence = Persistence(self.model)
        self.known = {id(t) for t in inventory.tensors}
        self.checksums, self.meta = checksums, meta
        self.tensors: list[torch.Tensor] = []
        self.rows: list[dict] = []
        self.records: list[tuple[int, list[str], dict]] = []
        self.active = False
        self.walks, self.walk_seconds = 0, 0.0  # the cost of finding them (`make bench`)
        self.found_now = False
        self._handles: list = []
        self._roots: list = []
        self._inputs: set[int] = set()
        self._signature: bytes | None = None
        self._used = np.zeros(0, dtype=bool)
        self._before: list = []

    def attach(self, handles: list) -> None:
        """The forward hook that sees the graph's roots; `handles` are removed by the owner.
        None on a module compiled in place (`module.compile()`): its hooks would run inside
        the compiled frame, so the graph is then walked from the loss only."""
        self._handles = handles
        self.persistence.take_before()
        if isinstance(self.entry, torch.nn.Module) and \
                getattr(self.entry, "_compiled_call_impl", None) is None:
            handles.append(ModuleHook(self, "_forward").register(
                self.entry, self.entry.register_forward_hook, with_kwargs=True))

    def _forward(self, _module, args, kwargs, output):
        # Traced by dynamo (a compiled caller of this module), it is nothing: no graph break,
        # and no guard on anything of diagkit's (checked first, before `active` is read).
        if not torch.compiler.is_compiling() and self.active:
            # arguments are inputs; the output's grad_fns are roots of the graph
            self._inputs.update(id(t) for t in nested_tensors((args, kwargs)))
            outputs = itertools.islice(nested_tensors(output), _ROOTS)
            self._roots.extend(t.grad_fn for t in outputs if t.grad_fn is not None)

    def begin(self) -> None:
        """A step starts: what each known tensor and its .grad are before it."""
        self.active, self._roots, self._inputs = True, [], set()
        self._used = np.zeros(len(self.tensors), dtype=bool)
        if self.tensors and not self.meta:
            with torch.no_grad():
                self._before = [(t.detach().clone(), None if t.grad is None else
                                 t.grad.detach().clone()) for t in self.tensors]

    def abort(self) -> None:
        """The step raised: nothing of it is recorded."""
        self.active, self._roots, self._before = False, [], []

    def end(self, step: int, loss, used) -> None:
        """A step ended: measure the known ones, walk the graph if it may have changed."""
        self.active = False
        found_before = len(self.tensors)
        record = self._measure() if found_before else None  # the known ones, before the walk
        if isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            self._roots.append(loss.grad_fn)
        signature = np.asarray(used, dtype=bool).tobytes()
        # Walked again while a leaf of an earlier step lives on: this step may reuse it.
        if self._roots and (signature != self._signature or self.persistence.pending()):
            self._signature = signature
            try:
                self._discover()
            except Exception as exc:  # diagkit's own extra: never the run's failure
                warnings.warn(f"diagkit: could not look for unregistered tensors: "
                              f"{type(exc).__name__}: {exc}", stacklevel=2)
        fresh = self._first_record(found_before)
        self.found_now = fresh is not None  # new rows: a rank's written rows are stale
        if record is not None or fresh is not None:
            merged = {c: np.concatenate([r[c] for r in (record, fresh) if r is not None])
                      for c in (record or fresh)}
            self.records.append((step, [r["name"] for r in self.rows], merged))
        self._roots, self._inputs, self._before = [], set(), []

    def _discover(self) -> None:
        started = time.perf_counter()
        taken = self.known | {id(t) for t in self.tensors} | self._inputs
        # FSDP1's flat parameters stand for the model's own tensors (`measure.engines.fsdp1`)
        new = [t for t in graph_leaves(self._roots) if id(t) not in taken and t.requires_grad
               and (t.grad is not None or self.meta) and not getattr(t, "_is_flat_param", False)]
        # Only state: a leaf made during the step (an activation made to require grad, an
        # adversarial input) is never unregistered, kept or copied (`step_graph.Persistence`).
        new = self.persistence.sort(list({id(t): t for t in new}.values()))
        paths = {id(t): self.persistence.where_before(t) for t in new}
        later = {k for k, where in paths.items() if where is None}
        paths.update(find_paths(self.model, later) if later else {})
        paths = {k: where for k, where in paths.items() if where is not None}
        new.sort(key=lambda t: (id(t) not in paths, paths.get(id(t), ("",))[0]))
        for t in new:
            name, module, module_type = paths.get(id(t)) or (
                f"<unregistered #{len(self.rows)} {tuple(t.shape)} {t.dtype}>", "", "")
            self.rows.append(_row(name, t, module, module_type))
            self.tensors.append(t)
            self._handles.append(t.register_post_accumulate_grad_hook(
                self._accumulated(len(self.tensors) - 1)))
        self.walks += 1
        self.walk_seconds += time.perf_counter() - started

    def _accumulated(self, k: int):
        def hook(_tensor):
            if torch.compiler.is_compiling():  # traced (compiled autograd): nothing
                return
            if self.active and k < len(self._used):
                self._used[k] = True
        return hook

    def _measure(self) -> dict:
        """The known tensors' step, measured as the observer measures its own."""
        n = len(self._used)
        out = _empty(n, self.checksums)
        out["used"] = self._used.copy()
        out["requires_grad"] = np.array([t.requires_grad for t in self.tensors[:n]], dtype=bool)
        if self.meta:
            return out
        with torch.no_grad():
            for k, (t, (value, grad)) in enumerate(zip(self.tensors, self._before)):
                g = t.grad
                if g is not None:
                    out["grad_total_norm"][k] = float(g.float().norm())
                if out["used"][k] and g is not None:
                    fresh = g if grad is None else g - grad
                    out["grad_norm"][k] = float(fresh.float().norm())
                    out["nonfinite"][k] = not bool(torch.isfinite(fresh).all())
                    out["carried_grad"][k] = grad is not None and bool(grad.ne(0).any())
                diff = float((t.detach().float() - value.float()).norm())
                out["delta_norm"][k] = diff
                out["changed"][k] = bool(t.detach().ne(value).any())
                size = float(value.float().norm())
                out["update_ratio"][k] = diff / size if size else np.nan
                if self.checksums:
                    out["checksum"][k] = float(checksum(t.detach()))
        return out

    def _first_record(self, start: int) -> dict | None:
        """The discovery step of the tensors found now: used, the .grad's norm, no change."""
        new = self.tensors[start:]
        if not new:
            return None
        out = _empty(len(new), self.checksums)
        out["used"][:] = True
        out["requires_grad"] = np.array([t.requires_grad for t in new], dtype=bool)
        if not self.meta:
            with torch.no_grad():
                for k, t in enumerate(new):
                    out["grad_norm"][k] = out["grad_total_norm"][k] = float(t.grad.float().norm())
                    out["nonfinite"][k] = not bool(torch.isfinite(t.grad).all())
                    if self.checksums:
                        out["checksum"][k] = float(checksum(t.detach()))
        return out

    def forget_grads(self) -> None:
        """After diagkit's own steps: drop the .grad they left (the run is put back)."""
        for t in self.tensors:
            t.grad = None

    def table(self) -> pd.DataFrame:
        """Their rows of the steps table."""
        columns = list(STEPS_COLUMNS) + (["checksum"] if self.checksums else [])
        frames = [pd.DataFrame({"step": np.full(len(names), s, dtype=np.int64),
                                "name": np.array(names, dtype=object), **rec}, columns=columns)
                  for s, names, rec in self.records]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    def with_step(self, step: int, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One step's columns (arrays) with the unregistered tensors' rows of that step after
        them. No DataFrame: it is asked at every observed step a rank publishes, and nothing
        found is the common case."""
        for s, names, rec in self.records:
            if s == step:
                extra = {"step": np.full(len(names), s, dtype=np.int64),
                         "name": np.array(names, dtype=object), **rec}
                columns = {c: np.concatenate([a, np.asarray(
                    extra.get(c, np.full(len(names), np.nan))).astype(a.dtype, copy=False)])
                    for c, a in columns.items()}
        return columns


def with_unregistered(steps: pd.DataFrame, extra: pd.DataFrame) -> pd.DataFrame:
    """A steps table with the unregistered tensors' rows, step by step."""
    if extra.empty:
        return steps
    extra = extra.astype({c: steps[c].dtype for c in extra.columns if c in steps.columns})
    both = pd.concat([steps, extra], ignore_index=True)
    return both.sort_values("step", kind="stable").reset_index(drop=True)


def _empty(n: int, checksums: bool) -> dict:
    out = {c: (np.zeros(n, dtype=bool) if c in BOOL_STEP_COLUMNS else np.full(n, np.nan))
           for c in list(STEPS_COLUMNS)[2:]}
    if checksums:
        out["checksum"] = np.full(n, np.nan)
    return out


def _row(name, tensor, module, module_type) -> dict:
    """An inventory row for a tensor outside the model's parameters and every optimizer."""
    return {"name": name, "aliases": (), "module": module, "module_type": module_type,
            "shape": tuple(tensor.shape), "numel": tensor.numel(),
            "bytes": tensor.numel() * tensor.element_size(), "dtype": str(tensor.dtype),
            "device": str(tensor.device), "placement": "", "stage": "", "in_model": False,
            "requires_grad": tensor.requires_grad, "memberships": (), "n_optimizers": 0,
            "optimizer": None, "group": None, "lr": float("nan"),
            "weight_decay": float("nan")}
