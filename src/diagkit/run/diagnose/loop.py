"""The step loop diagkit runs itself: the observer only observes (`diagkit.measure.step.observer`),
this module runs the steps and says what its loop guarantees.

The standard loop, once per step, exactly: `opt.zero_grad(set_to_none=...)` for each optimizer;
`batch = batch_fn()`; `loss = loss_fn(model, batch)`; `loss.backward()`; `opt.step()` for each
optimizer; `lr_scheduler.step()` if one was given. A `train_step(i)` is called as it is.

Under torch.distributed, `through_ddp` runs the standard loop's whole `loss_fn` inside the
forward of a DistributedDataParallel: `loss_fn` still gets the target's own model.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from ...core.errors import DiagkitError
from ...core.result import StepFailure
from ...measure.step.observer import Observer
from ...measure.step.state import LoopFacts
from ..target import deadline
from .gather import distributed
from ..target.target import Setup


def run_steps(observer: Observer, step_fn: Callable[[int], object], steps: int,
              every: int = 1) -> StepFailure | None:
    """Run `steps` steps, observing steps 0, every, 2*every, ...; stop at the first failure.

    Between observed steps the hooks stay attached but idle, so a long run keeps a steps table
    of steps/every rows per tensor. `observer` was attached just before: nothing ran since.
    """
    try:
        return _steps(observer, step_fn, steps, every)
    finally:
        deadline.finish()  # judging and writing the result are not the run's to time out


def _steps(observer: Observer, step_fn, steps: int, every: int) -> StepFailure | None:
    """`run_steps`' loop. A step that raises, calls sys.exit or outlives `--timeout` is the
    run's failure (the steps before it are kept); Ctrl-C still ends the run."""
    # The observer was attached just before (`pipeline.observe`): the first step follows its
    # snapshot directly, as consecutive steps follow each other.
    previous, step = -1, 0
    try:
        for step in range(steps):
            observed = step % every == 0
            if observed:
                observer.begin_step(step, consecutive=previous == step - 1)
            deadline.mark("in its train_step", step)
            try:
                loss = step_fn(step)
            except (Exception, SystemExit, deadline.TimedOut) as exc:  # keep earlier steps
                if observed:
                    observer.abort_step()
                return StepFailure(step=step, error=failure_text(exc),
                                   traceback=traceback.format_exc())
            if observed:
                observer.end_step(loss)
                previous = step
    except deadline.TimedOut as exc:  # expired in diagkit's own bookkeeping of the step
        if observer.active:
            observer.abort_step()
        return StepFailure(step=step, error=str(exc), traceback="")
    return None


def failure_text(exc: BaseException) -> str:
    """The step's failure in one line; a sys.exit in the user's step is named as one."""
    if isinstance(exc, deadline.TimedOut):
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"the target called sys.exit({exc.code!r}) in its step"
    return f"{type(exc).__name__}: {exc}"


def loop_facts(setup: Setup) -> LoopFacts:
    """What the loop guarantees to the observer: only the standard loop promises anything; a
    hand-written `train_step` may do anything to .grad, and under a process group DDP's
    all-reduce writes .grad of tensors this rank did not use."""
    standard = setup.train_step is None
    return LoopFacts(grads_untouched_until_step=standard,
                     held_grads_start_none=standard and setup.zero_grad_set_to_none
                     and not distributed())


def step_function(setup: Setup) -> Callable[[int], object]:
    """One training step of `setup`: its `train_step`, or the standard loop's step."""
    if setup.train_step is not None:
        return setup.train_step

    def standard_step(step: int):
        deadline.mark("in zero_grad", step)
        for opt in setup.optimizers:
            opt.zero_grad(set_to_none=setup.zero_grad_set_to_none)
        deadline.mark("in its batch (batch_fn)", step)
        batch = setup.batch_fn()
        deadline.mark("in its forward/backward (loss_fn, backward)", step)
        loss = setup.loss_fn(setup.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise DiagkitError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}"
                               + (f" of shape {tuple(loss.shape)}"
                                  if isinstance(loss, torch.Tensor) else ""))
        loss.backward()
        deadline.mark("in its optimizer step", step)
        for opt in setup.optimizers:
            opt.step()
        if setup.lr_scheduler is not None:
            setup.lr_scheduler.step()
        return loss  # with its grad_fn: a root of the graph the unregistered tensors are found in
    return standard_step


class LossModule(torch.nn.Module):
    """`loss_fn(model, batch)` as the forward of a module that holds `model`.

    Wrapped in DDP, the whole `loss_fn` runs inside DDP's forward (as Lightning wraps its
    `training_step`): `loss_fn` gets the target's own model, so `model.training_step(...)` and
    calls into submodules work, while DDP still prepares its reducer for the backward (and, with
    find_unused_parameters=True, searches the graph from the loss). Calling the inner model
    directly instead would bypass DDP's forward: no gradient would be averaged.
    """

    def __init__(self, model: torch.nn.Module, loss_fn: Callable):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn  # a function: not registered as a submodule

    def forward(self, batch):
        return self.loss_fn(self.model, batch)


def through_ddp(setup: Setup, **ddp_kwargs) -> tuple[Setup, DistributedDataParallel]:
    """A copy of a standard-loop `setup` whose loss is computed by DDP(LossModule(...)), and
    that DDP. The copy's model is still the target's: its names are the ones the target's code
    saw (no `module.` prefix added by diagkit) and `loss_fn` receives it."""
    if setup.train_step is not None:
        raise DiagkitError("through_ddp needs the standard loop (batch_fn + loss_fn)")
    ddp = DistributedDataParallel(LossModule(setup.model, setup.loss_fn), **ddp_kwargs)
    return dataclasses.replace(setup, loss_fn=lambda _model, batch: ddp(batch)), ddp
