"""`diagnose`: measure, then judge, then hand back a `Diagnosis`."""

from __future__ import annotations

import dataclasses
import time

import pandas as pd
import torch

from .delta import DEFAULT_SAMPLE, check_options
from .diagnosis import Diagnosis
from .errors import DiagkitError
from .findings import build_advice, build_findings
from .inventory import take_inventory
from .recorder import Recorder, StepFailure, run_steps
from .state import SavedState
from .summary import build_params
from .target import DEFAULT_STEPS, Setup
from .verdicts import judge


def diagnose(model, optimizer=None, *, batch_fn=None, loss_fn=None, train_step=None,
             steps: int | None = None, zero_grad_set_to_none: bool | None = None,
             lr_scheduler=None, restore: bool = True, delta: str = "exact", every: int = 1,
             sample: int = DEFAULT_SAMPLE) -> Diagnosis:
    """Run `steps` real training steps under observation and judge every tensor.

    `model` may also be a `Setup` (from `load_target`), which then supplies everything else.
    With `restore=True` the model, buffers, optimizers, grads and RNG states come back bitwise.
    `delta`: how each step's change is measured ("exact", or "sampled" / "off" for models that
    do not fit twice in memory; see `diagkit.delta`); all three give the same verdicts.
    `every`: observe only steps 0, every, 2*every, ... of a long run (the others run as usual).
    """
    setup = _as_setup(model, optimizer, batch_fn, loss_fn, train_step, zero_grad_set_to_none,
                      lr_scheduler)
    run = observe(setup, steps, restore=restore, delta=delta, every=every, sample=sample)
    return judge_run(run.rows, run.steps, run.failure, run.meta)


@dataclasses.dataclass
class Observation:
    """What one process measured: the static rows, the steps table, a failure, run facts."""

    rows: list[dict]
    steps: pd.DataFrame
    failure: StepFailure | None
    meta: dict


def observe(setup: Setup, steps: int | None = None, *, restore: bool = True,
            checksums: bool = False, on_progress=None, delta: str = "exact", every: int = 1,
            sample: int = DEFAULT_SAMPLE) -> Observation:
    """Measure only: run the steps under hooks and return the tables (no judging)."""
    n_steps = steps if steps is not None else (setup.steps or DEFAULT_STEPS)
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise DiagkitError(f"steps must be a positive int, got {n_steps!r}")
    check_options(delta, sample, every)

    inventory = take_inventory(setup.model, setup.optimizers)
    if not inventory.tensors:
        raise DiagkitError("the model has no parameters and the optimizers hold none: "
                           "nothing to diagnose")
    recorder = Recorder(inventory, setup.optimizers, checksums=checksums,
                        on_progress=on_progress, delta=delta, sample=sample, **loop_facts(setup))
    saved = (SavedState(setup.model, inventory.tensors, setup.optimizers, setup.lr_scheduler)
             if restore else None)
    started = time.perf_counter()
    try:
        recorder.attach()
        failure = run_steps(recorder, step_function(setup), n_steps, every=every)
    finally:
        recorder.detach()
        if saved is not None:
            saved.restore()
    meta = {
        "steps_requested": n_steps,
        "loop": "train_step" if setup.train_step is not None else "standard",
        "losses": recorder.losses,
        "seconds": round(time.perf_counter() - started, 4),
        "torch": torch.__version__,
        "restored": restore,
        "delta": delta,
        "every": every,
        **({"sample": sample} if delta != "exact" else {}),
    }
    return Observation(inventory.rows, recorder.steps_table(), failure, meta)


def loop_facts(setup: Setup) -> dict[str, bool]:
    """What the loop guarantees to the recorder (see `Recorder`): only the standard loop
    (SPEC 2.1) promises anything; a hand-written `train_step` may do anything to .grad, and
    under a process group DDP's all-reduce writes .grad of tensors this rank did not use."""
    standard = setup.train_step is None
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return {"grads_untouched_until_step": standard,
            "held_grads_start_none": standard and setup.zero_grad_set_to_none
            and not distributed}


def judge_run(rows: list[dict], steps_table: pd.DataFrame, failure: StepFailure | None,
              meta: dict) -> Diagnosis:
    """Judge what was observed (by one process, or gathered from every rank)."""
    params = build_params(rows, steps_table)
    params["verdicts"], check_errors = judge(params, steps_table)
    meta = {**meta, "steps_observed": int(steps_table["step"].nunique()) if len(steps_table)
            else 0}
    return Diagnosis(params=params, steps=steps_table,
                     findings=build_findings(params, steps_table, check_errors, failure),
                     advice=build_advice(params, steps_table), failure=failure, meta=meta)


def _as_setup(model, optimizer, batch_fn, loss_fn, train_step, zero_grad_set_to_none,
              lr_scheduler) -> Setup:
    if isinstance(model, Setup):
        extra = [k for k, v in (("optimizer", optimizer), ("batch_fn", batch_fn),
                                ("loss_fn", loss_fn), ("train_step", train_step),
                                ("lr_scheduler", lr_scheduler),
                                ("zero_grad_set_to_none", zero_grad_set_to_none)) if v is not None]
        if extra:
            raise DiagkitError(f"a Setup already carries its loop; drop {', '.join(extra)}")
        return model
    return Setup(model=model, optimizers=optimizer, batch_fn=batch_fn, loss_fn=loss_fn,
                 train_step=train_step,
                 zero_grad_set_to_none=True if zero_grad_set_to_none is None
                 else zero_grad_set_to_none,
                 lr_scheduler=lr_scheduler)


def step_function(setup: Setup):
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


def run_target(target: str, target_args: dict | None = None, *, steps: int | None = None,
               checkpoint: str | None = None, trust_checkpoint: bool = False, nproc: int = 1,
               timeout: float = 120, delta: str = "exact", every: int = 1) -> Diagnosis:
    """What `diagkit check`, `diagkit report` and the notebook run: a target, optionally a
    checkpoint loaded into it first, in this process or under torch.distributed."""
    from .checkpoint import audit, audit_finding, load_checkpoint, load_findings
    from .findings import sort_findings

    check_options(delta, every=every)
    if nproc > 1:
        from .distributed import diagnose_distributed
        diag = diagnose_distributed(target, target_args, nproc=nproc, steps=steps,
                                    checkpoint=checkpoint, trust_checkpoint=trust_checkpoint,
                                    timeout=timeout, delta=delta, every=every)
        report = diag.checkpoint
    else:
        from .target import load_target
        setup = load_target(target, **(target_args or {}))
        report = (load_checkpoint(setup.model, checkpoint, trust=trust_checkpoint,
                                  optimizers=setup.optimizers) if checkpoint else None)
        diag = diagnose(setup, steps=steps, delta=delta, every=every)
    if report is None:
        return diag
    from .checkpoint import LoadReport
    report = report if isinstance(report, LoadReport) else LoadReport(**report["load"])
    result = audit(diag.params, report)
    diag.checkpoint = {"load": report.to_dict(), "audit": result, "summary": report.summary()}
    extra = load_findings(report) + [f for f in [audit_finding(result, report.path)] if f]
    diag.findings = sort_findings(diag.findings + extra)
    return diag
