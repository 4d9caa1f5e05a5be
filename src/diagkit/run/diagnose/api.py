"""The library's entry points: `diagnose` (objects in hand) and `run_target` (what the CLI and
the notebook run: a target spec, maybe a checkpoint first, maybe under torch.distributed)."""

from __future__ import annotations

from ...core.errors import DiagkitError
from ...core.options import DEFAULTS, check_meta_options, check_run_options, meta_device
from ...core.result import Diagnosis
from ...measure.checkpoints.load import load_checkpoint
from .pipeline import judge_observation, observe
from ..target.target import Setup, load_target


def diagnose(model, optimizer=None, *, batch_fn=None, loss_fn=None, train_step=None,
             steps: int | None = None, zero_grad_set_to_none: bool | None = None,
             lr_scheduler=None, restore: bool = True, delta: str = DEFAULTS["delta"],
             every: int = DEFAULTS["every"], sample: int = DEFAULTS["sample"],
             device=None) -> Diagnosis:
    """Run `steps` real training steps under observation and judge every tensor.

    `model` may also be a `Setup` (from `load_target`), which then supplies everything else.
    With `restore=True` the model, buffers, optimizers, grads and RNG states come back bitwise.
    `delta`: how each step's change is measured ("exact", or "sampled" / "off" for models that
    do not fit twice in memory; see docs/cost.md, "Cost of observation"); all three give the
    same verdicts. `every`: observe only steps 0, every, 2*every, ... of a long run.
    `device="meta"`: a dry run of the wiring of a model built on the meta device (one forward
    and backward, no parameter memory; see docs/meta.md, "Dry run on meta"). A model that is
    not on meta is refused in one line, never moved (that would discard its weights).
    """
    on_meta = meta_device(device)
    setup = _as_setup(model, optimizer, batch_fn, loss_fn, train_step, zero_grad_set_to_none,
                      lr_scheduler)
    if on_meta:
        from .meta import observe_meta
        return judge_observation(observe_meta(setup))
    return judge_observation(observe(setup, steps, restore=restore, delta=delta, every=every,
                                     sample=sample))


def run_target(target: str, target_args: dict | None = None, *, steps: int | None = None,
               checkpoint: str | None = None, trust_checkpoint: bool = False,
               nproc: int = DEFAULTS["nproc"], timeout: float = DEFAULTS["timeout"],
               delta: str = DEFAULTS["delta"], every: int = DEFAULTS["every"],
               meta: bool = DEFAULTS["meta"]) -> Diagnosis:
    """A target, optionally a checkpoint loaded into it first, in this process or (nproc > 1)
    under torch.distributed. `meta`: built on the meta device, one pass (`run.diagnose.meta`)."""
    check_run_options(steps=steps, delta=delta, every=every)
    check_meta_options(meta, nproc=nproc, checkpoint=checkpoint)
    if meta:
        from .meta import load_on_meta, observe_meta
        return judge_observation(observe_meta(load_on_meta(target, **(target_args or {}))))
    if nproc > 1:
        from .launcher import diagnose_distributed
        return diagnose_distributed(target, target_args, nproc=nproc, steps=steps,
                                    checkpoint=checkpoint, trust_checkpoint=trust_checkpoint,
                                    timeout=timeout, delta=delta, every=every)
    setup = load_target(target, **(target_args or {}))
    report = (load_checkpoint(setup.model, checkpoint, trust=trust_checkpoint,
                              optimizers=setup.optimizers) if checkpoint else None)
    return judge_observation(observe(setup, steps, delta=delta, every=every), checkpoint=report)


def _as_setup(model, optimizer, batch_fn, loss_fn, train_step, zero_grad_set_to_none,
              lr_scheduler) -> Setup:
    """The `Setup` that `diagnose`'s arguments describe (a `Setup` passed alone as is)."""
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
