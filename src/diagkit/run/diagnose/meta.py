"""A dry run of the wiring on the meta device: build the target there, run one forward and
backward, and hand the pipeline an `Observation` whose value columns are not measured.

A meta tensor holds no values, so a model of any size is built in seconds with no parameter
memory, and one pass tells what autograd reaches. No optimizer steps: a meta step cannot
change values. The standard loop's batch is `batch_fn()`, run as it is, with its floating
tensors moved to meta; integer and bool tensors (token ids, masks) stay real, since torch
embeds a meta weight with CPU ids. If the pass then fails on a device mismatch (e.g. CPU
labels in a loss of meta logits), it runs once more with every tensor of the batch on meta.
A `train_step(0)` runs once, as it is, under `torch.device("meta")`.
"""

from __future__ import annotations

import time
import traceback

import torch

from ...core.errors import DiagkitError
from ...core.result import StepFailure
from ...measure.model.inventory import take_inventory
from ...measure.model.meta_pass import MetaPass, batch_to_meta, has_real_tensor, off_meta
from ..target import deadline
from .loop import failure_text
from .pipeline import Observation
from ..target.target import Setup, load_target

META = torch.device("meta")
# What a step that needs values says on meta, and the hint a user needs then.
_VALUE_HINT = ("(on the meta device the step can do nothing that reads a value: .item(), "
               "printing a tensor, a branch on a tensor's value)")


def load_on_meta(target: str, **kwargs) -> Setup:
    """Build the target inside `with torch.device("meta"):`: its tensors are made on meta,
    wherever the target does not name a device itself."""
    with META:
        return load_target(target, **kwargs)


def observe_meta(setup: Setup):
    """One observed forward and backward of `setup` on meta; an `Observation` (run.diagnose.pipeline)."""
    try:
        inventory = take_inventory(setup.model, setup.optimizers)
        if not inventory.tensors:
            raise DiagkitError("the model has no parameters and the optimizers hold none: "
                               "nothing to diagnose")
        elsewhere = off_meta(inventory.tensors)
        if elsewhere:
            raise DiagkitError(
                f"device='meta' needs a model built on the meta device, but "
                f"{sum(t.device.type != 'meta' for t in inventory.tensors)} of its "
                f"{len(inventory.tensors)} tensors are on {', '.join(elsewhere)}: build it "
                "inside `with torch.device('meta'):` (diagkit check --meta does) — a real "
                "model is never moved, that would discard its weights")
    except BaseException:
        deadline.finish()
        raise
    seen = MetaPass(inventory, setup.optimizers)
    started = time.perf_counter()
    deadline.mark("in its meta pass", 0)
    try:
        with seen:
            failure, loss = _run_pass(setup, seen)
    finally:
        deadline.finish()
    meta = {"steps_requested": 1, "device": "meta",
            **({"timed_out": True} if deadline.is_timeout(failure) else {}),
            "loop": "train_step" if setup.train_step is not None else "standard",
            "losses": [], "seconds": round(time.perf_counter() - started, 4),
            "torch": torch.__version__, "restored": True, "delta": "off", "every": 1,
            "batch_on_meta": loss,
            **({"optimizer_sources": setup.optimizer_sources} if setup.optimizer_sources
               else {})}
    steps = seen.steps_table() if failure is None else seen.steps_table().iloc[:0]
    return Observation(seen.rows, steps, failure, meta)


def _run_pass(setup: Setup, seen: MetaPass) -> tuple[StepFailure | None, str]:
    """The pass, and where the batch's integer tensors were: "floats" (ids kept real) or
    "all" (moved too, after a device mismatch). A failure is the run's `StepFailure`."""
    try:
        if setup.train_step is not None:
            with META:
                seen.found(setup.train_step(0))
            return None, "train_step"
        batch = setup.batch_fn()
        try:
            seen.found(_forward_backward(setup, batch_to_meta(batch)))
            return None, "floats"
        except RuntimeError as exc:
            if "meta" not in str(exc) or not has_real_tensor(batch_to_meta(batch)):
                raise
        seen.reset()  # a device mismatch: every tensor to meta, once more
        seen.found(_forward_backward(setup, batch_to_meta(batch, ids_too=True)))
        return None, "all"
    except (Exception, SystemExit, deadline.TimedOut) as exc:
        text = failure_text(exc)
        hint = "meta" in str(exc) and not isinstance(exc, deadline.TimedOut)
        return StepFailure(step=0, error=f"{text} {_VALUE_HINT}" if hint else text,
                           traceback=traceback.format_exc()), ""


def _forward_backward(setup: Setup, batch) -> torch.Tensor:
    with META:
        loss = setup.loss_fn(setup.model, batch)
        if not isinstance(loss, torch.Tensor):
            raise DiagkitError(f"loss_fn must return a tensor to backward through, got "
                               f"{type(loss).__name__}")
        loss.backward()
    return loss  # the root of the graph its unregistered tensors are found in
