"""Observe real training steps that someone else runs: the only place torch hooks are set.

The observer does not own the loop. Whoever runs the steps (diagkit's own loop in
`diagkit.run.diagnose.loop`, or a user's) brackets each observed step with `begin_step()` and
`end_step()`; the optimizers' step pre-hooks tell it when each optimizer steps. Hooks live only
while it is attached, as a context manager:

    with Observer(inventory, optimizers) as obs:
        obs.begin_step(0); train_one_step(); obs.end_step(loss)
    obs.steps_table()

Per step and tensor it records the columns of `diagkit.core.schema.STEPS_COLUMNS`, batched
and read back once per step and device; tensors outside `.parameters()` that get gradients are
found and measured by `diagkit.measure.model.unregistered`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from ...core.options import DEFAULTS
from ..batched.buckets import Buckets, Layout
from ..model.inventory import Inventory, group_lr
from ..change.probes import make_probe
from ..batched.readback import as_float
from ..engines.shards import measured_parts
from . import step_end
from .optimizer_reads import read_at_step
from .skips import Holdings, resting_rows
from ..change.split_probe import FrozenWindow
from ..tables.step_records import StepRecords
from .state import LoopFacts, StepState
from .strategy_plan import plan_strategies
from ..model.unregistered import Unregistered, with_unregistered


class Observer:
    """Per-step observation of `inventory`'s tensors under `optimizers`.

    `delta`: the probe that measures each step's change (`diagkit.measure.change.probes`).
    `checksums`: a value fingerprint per tensor and step, to compare ranks. `on_progress(event,
    step, observer)`: a watchdog's feed ("begin", "backward", "end"). `loop`: what the loop
    running the steps guarantees (`LoopFacts`; nothing by default). `step_ends`: the caller
    also calls `step_ended(i)` as each optimizer step returns (its post-hook), so a backward
    inside `optimizer.step(closure)` can be told apart from one after the step. `entry`: the
    module the loop calls where that is not the inventory's model (a `torch.compile`
    wrapper: `measure.engines.unwrap.compiled_entry`); its forward hook sees the step's outputs.
    An optimizer whose step pre-hook never fires in a step (a loss scaler's skip) marks its
    tensors `skipped`; skips inside a longer step are counted (`diagkit.measure.step.skips`).
    """

    def __init__(self, inventory: Inventory, optimizers: list[torch.optim.Optimizer], *,
                 delta: str = DEFAULTS["delta"], sample: int = DEFAULTS["sample"],
                 checksums: bool = False, on_progress: Callable | None = None,
                 loop: LoopFacts = LoopFacts(), step_ends: bool = False,
                 memory_budget: float = DEFAULTS["memory_budget"], entry=None):
        self.inv, self.tensors, self.optimizers = inventory, inventory.tensors, optimizers
        self.n = n = len(self.tensors)
        self.checksums, self.on_progress, self.loop = checksums, on_progress, loop
        self.active = False          # between begin_step and end_step: hooks record
        self.step_ends = step_ends
        self.stepping: int | None = None  # the optimizer inside its step() (with step_ends)
        self.state: StepState | None = None
        self.losses: list[float] = []
        self.zero_grad_expected: set[int] = set()  # exactly-zero fresh gradients last step
        self.resting: set[int] = set()  # optimizers that rested in this step (`StepClock`)
        self._handles: list = []
        self.records = StepRecords(inventory.names, checksums)
        self._held_by = inventory.held_by(len(optimizers))
        self._lr_slots, self.slot_of = inventory.lr_slots()  # each tensor's lr slot, or -1
        held = {int(k) for ks in self._held_by for k in ks}
        # What is measured of each tensor: itself, or this rank's shard of a DTensor (FSDP2).
        self.shards, self.sharded, self.local = measured_parts(self.tensors, inventory.slices)
        self.probe = make_probe(
            delta, self.local, {k for k, t in enumerate(self.tensors)
                                if not t.requires_grad or k not in held}, sample,
            frozen={k for k, t in enumerate(self.tensors)  # fingerprinted, not copied
                    if not t.requires_grad and k not in held}, memory_budget=memory_budget)
        # The frozen base, read when observing begins and ends (`close_window`), not each step.
        self.window = getattr(self.probe, "window", None) or FrozenWindow(self.local, [])
        if checksums:
            self.probe.checksum_of = set(self.shards.fingerprinted)
            self.window.indices = []  # each step is published as recorded: read every step
        self.grad_buckets = Buckets(self.local)
        self.everything = Layout(list(range(n)), self.grad_buckets)
        plan = plan_strategies(self, self._held_by, self._handles)
        self._strategies, self._earned, self._read_by = plan.strategies, plan.earned, plan.read_by
        self.dropped: list[tuple[int, str]] = []  # (step, why) of steps not recorded
        self.holdings = Holdings(self._held_by, n)
        # Optimizer steps skipped in the observed steps (a loss scaler's; `diagkit.measure.step.skips`).
        self.skipped_optimizer_steps = 0
        self._all = np.arange(n)
        # leaves outside .parameters()
        self.unregistered = Unregistered(inventory, checksums, entry=entry)

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Observer":
        return self.attach() or self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close_window()
        self.detach()

    def attach(self) -> None:
        """Allocate the probe's buffers and set every hook (all undone if any of it fails)."""
        try:
            self.probe.attach()
            for strategy in self._strategies:
                strategy.attach(self._handles)
            for i, opt in enumerate(self.optimizers):
                self._handles.append(opt.register_step_pre_hook(self._optimizer_hook(i)))
            self.unregistered.attach(self._handles)
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        """Remove every hook and free every buffer; safe to call more than once."""
        self.active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.probe.detach()
        self.grad_buckets.clear()
        if self.state is not None:
            self.state.release()

    attached = property(lambda self: bool(self._handles), doc="Whether any hook is set.")

    def close_window(self) -> set[int]:
        """Observing ends: read the frozen base once and mark what changed since it was last
        read changed on the last recorded step (`split_probe.FrozenWindow`). Whoever ends
        observing calls it before judging, attached or not (`with Observer` does, before
        detaching); never raises. Returns the tensors marked."""
        return self.window.close(self.records)

    def continue_window(self, other: "Observer") -> None:
        """Go on with `other`'s frozen-base window instead of reading the base again (a whole
        run's next observer: `diagkit.run.watch.whole_run`)."""
        self.window.continue_from(other.window)

    def progress(self, event: str) -> None:
        """Tell the watchdog (`on_progress`) how far the step in progress has come."""
        if self.on_progress is not None:
            self.on_progress(event, self.state.index, self)

    # ----------------------------------------------------------------- steps
    def begin_step(self, step: int | None = None, consecutive: bool = False) -> None:
        """Start observing a step. `consecutive`: nothing ran since the last `end_step` (or,
        for the first step, since `attach`)."""
        self.state = StepState.begin(len(self.records) if step is None else step, self.n,
                                     len(self.optimizers))
        self.stepping = None
        self.probe.begin(consecutive=consecutive)
        self.active = True
        self.unregistered.begin()
        self.progress("begin")

    def abort_step(self) -> None:
        """The step raised: drop its partial observations."""
        self.active = False
        self.state.release()
        self.unregistered.abort()

    def forget_recorded(self) -> None:
        """Forget every step recorded so far (a loop that said afterwards where its steps
        end: `measure.clock.step_clock.StepClock.step`)."""
        self.records = StepRecords(self.inv.names, self.checksums)
        self.losses, self.dropped, self.skipped_optimizer_steps = [], [], 0
        self.unregistered.records = []

    def end_step(self, loss=None) -> bool:
        """Record the step: read what no optimizer read, then one read-back for everything
        (`step_end`). False: the step could not be attributed and is not recorded (`dropped`)."""
        st = self.state
        if not st.read.all():
            read_at_step(self, self._all)  # what no optimizer stepped: as it stands now
        self.active = False
        pending, keys = step_end.queue(self, st, loss)
        got = pending.read()
        got["checksum"] = self.shards.spread(got["checksum"])  # 0 where sharded: not compared
        end = step_end.resolve(self, st, got, keys)
        self.zero_grad_expected = end.zero_now
        if st.dropped is not None:
            self.dropped.append((st.index, st.dropped))
            st.release()
            return False
        self._record(st, end, got["checksum"])
        self.unregistered.end(st.index, loss, st.used)
        st.release()
        if keys["scalar_loss"]:
            self.losses.append(float(got["loss"][0]))
        elif loss is not None:
            self.losses.append(as_float(loss))
        self.progress("end")
        return True

    def _record(self, st: StepState, end: step_end.Resolved, checksums: np.ndarray) -> None:
        """Add the step to the records, for the tensors it is recorded for, and count its
        skipped optimizer steps; the earned shares judge it first (it was hooked)."""
        for share in self._earned:
            share.judge_step(st)
        # A step some optimizer skipped counts its skips; a merged skip is one a later
        # iteration of the same step ran on from (the watch's steps, which every optimizer took).
        skipping = end.skipping
        self.skipped_optimizer_steps += int(skipping.sum()) if skipping.any() else end.merged
        rows = resting_rows(self.inv.rows, self.resting, st.used)
        self.resting = set()
        self.records.add(st.index, {
            "requires_grad": st.requires_grad, "used": st.used, "grad_norm": end.grad_norm,
            "grad_total_norm": end.grad_total, "carried_grad": end.carried_grad,
            "delta_norm": end.delta, "update_ratio": end.ratio, "changed": end.changed,
            "lr": st.lr, "nonfinite": end.nonfinite,
            "skipped": self.holdings.skipped(st, skipping),
            **({"checksum": checksums} if self.checksums else {})}, rows)

    # ----------------------------------------------------------------- optimizer time
    def _optimizer_hook(self, i: int) -> Callable:
        """Optimizer `i`'s step pre-hook: it stepped, and what it holds is read as it sees it."""
        strategies, rest = self._strategies, self._read_by[i]

        def hook(*_args):
            if self.active:
                self.state.stepped[i] = True
                if self.step_ends:
                    self.stepping = i
                for strategy in strategies:
                    strategy.at_optimizer_step(i, self.state)
                if len(rest):
                    read_at_step(self, rest)
        return hook

    def step_ended(self, i: int) -> None:
        """Optimizer `i`'s step() returned (told by whoever holds its post-hook: `StepClock`).
        What a backward inside that step (a closure) made stale is read again now, as the
        optimizer saw it. Without this call a closure's .grad is read before it ran."""
        self.stepping = None
        if self.active:
            read_at_step(self, self._read_by[i])

    def closure_backward(self, touched: list[int]) -> None:
        """A backward ended inside optimizer `stepping`'s step(): forget its stale reads."""
        held = self._read_by[self.stepping]
        stale = np.intersect1d(np.asarray(touched, dtype=np.int64), held[self.state.read[held]])
        if len(stale):
            self.state.forget_reads(stale)

    def group_lrs(self) -> np.ndarray:
        """The lr of each (optimizer, param group) slot, as it is now."""
        return np.array([group_lr(self.optimizers[i].param_groups[j])
                         if j < len(self.optimizers[i].param_groups) else math.nan
                         for i, j in self._lr_slots])

    # ----------------------------------------------------------------- result
    rows = property(lambda self: self.inv.rows + self.unregistered.rows,
                    doc="The static rows: the inventory's, then the unregistered ones found.")

    def steps_table(self) -> pd.DataFrame:
        """Every recorded step, one row per (step, tensor)."""
        return with_unregistered(self.records.table(), self.unregistered.table())

    def step_columns(self, step: int) -> dict:
        """The columns of one recorded step, as arrays (what a rank publishes as it goes)."""
        return self.unregistered.with_step(step, self.records.one(step))

    def step_table(self, step: int) -> pd.DataFrame:
        """The rows of one recorded step (what a watchdog writes out as the run goes)."""
        columns = self.step_columns(step)
        return pd.DataFrame(columns, columns=list(columns))

