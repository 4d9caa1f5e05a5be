"""The step loop diagkit runs itself: the observer only observes (`diagkit.measure.observer`),
this module runs the steps and says what its loop guarantees.

The standard loop, once per step, exactly: `opt.zero_grad(set_to_none=...)` for each optimizer;
`batch = batch_fn()`; `loss = loss_fn(model, batch)`; `loss.backward()`; `opt.step()` for each
optimizer; `lr_scheduler.step()` if one was given. A `train_step(i)` is called as it is.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import torch

from ..core.errors import DiagkitError
from ..core.result import StepFailure
from ..measure.observer import Observer
from ..measure.step_state import LoopFacts
from .target import Setup


def run_steps(observer: Observer, step_fn: Callable[[int], object], steps: int,
              every: int = 1) -> StepFailure | None:
    """Run `steps` steps, observing steps 0, every, 2*every, ...; stop at the first failure.

    Between observed steps the hooks stay attached but idle, so a long run keeps a steps table
    of steps/every rows per tensor.
    """
    previous = None
    for step in range(steps):
        observed = step % every == 0
        if observed:
            observer.begin_step(step, consecutive=previous == step - 1)
        try:
            loss = step_fn(step)
        except Exception as exc:  # the user's code: keep earlier steps, report this one
            if observed:
                observer.abort_step()
            return StepFailure(step=step, error=f"{type(exc).__name__}: {exc}",
                               traceback=traceback.format_exc())
        if observed:
            observer.end_step(loss)
            previous = step
    return None


def loop_facts(setup: Setup) -> LoopFacts:
    """What the loop guarantees to the observer: only the standard loop promises anything; a
    hand-written `train_step` may do anything to .grad, and under a process group DDP's
    all-reduce writes .grad of tensors this rank did not use."""
    standard = setup.train_step is None
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return LoopFacts(grads_untouched_until_step=standard,
                     held_grads_start_none=standard and setup.zero_grad_set_to_none
                     and not distributed)


def step_function(setup: Setup) -> Callable[[int], object]:
    """One training step of `setup`: its `train_step`, or the standard loop's step."""
    if setup.train_step is not None:
        return setup.train_step

    def standard_step(_step: int):
        for opt in setup.optimizers:
            opt.zero_grad(set_to_none=setup.zero_grad_set_to_none)
        batch = setup.batch_fn()
        loss = setup.loss_fn(setup.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise DiagkitError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}"
                               + (f" of shape {tuple(loss.shape)}"
                                  if isinstance(loss, torch.Tensor) else ""))
        loss.backward()
        for opt in setup.optimizers:
            opt.step()
        if setup.lr_scheduler is not None:
            setup.lr_scheduler.step()
        return loss.detach()
    return standard_step
