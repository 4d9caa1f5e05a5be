"""`diagkit.watch` on a Hugging Face `Trainer` run, as one callback
(pip install diagkit[transformers]).

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[DiagkitCallback(steps=20, out="diag/")])
    trainer.train()                 # diag/ holds the diagnosis; diagkit.load("diag/")

Why at `on_train_begin`: that is the first event after the Trainer has built (or taken) its
optimizer and run `accelerator.prepare`, and after its own `model.zero_grad()`; it hands the
callback `model` (the Trainer's model, under any DDP wrapping) and `optimizer` (accelerate's
`AcceleratedOptimizer`, which `watch` sees through to the torch optimizer whose `step()` really
runs: accumulation micro-batches and skipped steps are not optimizer steps). A step is one
optimizer step, i.e. one `state.global_step`. The Trainer clears gradients with
`model.zero_grad()`, so a tensor left out of the optimizer is `orphan` alone: its `.grad` is
cleared too.
"""

from __future__ import annotations

import sys

from . import Watching, alert_metrics, require
from ._trainer_optimizer import OptimizerOrigin

require("transformers", __name__, "diagkit[transformers]")

from transformers import TrainerCallback  # noqa: E402  (after the one-line install hint)
from transformers.utils import logging as hf_logging  # noqa: E402

# Under transformers' own logger tree: its verbosity and handler apply to diagkit's line too.
logger = hf_logging.get_logger("transformers.integrations.diagkit")


# What a fix calls the model and the optimizer: the Trainer's, as a notebook reaches them.
NAMES = {"model": "trainer.model", "optimizers": ["trainer.optimizer"]}


class DiagkitCallback(TrainerCallback, Watching):
    """Watch the Trainer's training run. Keyword arguments are `diagkit.watch`'s (`steps`,
    `every`, `delta`, `sample`, `out`, ...), passed to it unchanged and checked now.

    It detaches by itself after `steps` observed optimizer steps, or when training ends.
    `watch`: the `diagkit.Watch` of the last `train()`; `diagnosis`: its result (None on
    processes other than the main one). Only the main process writes `out`. A `train()` that
    raises sends no event: reading `diagnosis` then ends the watch, keeping the steps before.
    What diagkit refuses to watch as training begins is one warning through transformers'
    logger (`refused` keeps it) and training goes on unwatched; a bad option raises here.
    """

    def __init__(self, **watch_options):
        self._start_watching(watch_options)

    def on_init_end(self, args, state, control, **kwargs):
        """The Trainer builds its optimizer inside `train()`, in `create_optimizer`, before
        `on_train_begin`: where its groups are built is noted during that call (a
        `create_optimizer` the user overrode is then the finding's lever;
        `measure.provenance`), and what the Trainer's own built from as it returns. An
        optimizer passed as `optimizers=` is here already: the user's call is read now
        (`_trainer_optimizer`)."""
        trainer = _calling_trainer()
        self._origin = OptimizerOrigin()
        if trainer is not None:
            self._origin.note_handed(trainer, _constructor_caller(trainer))
            self._run.record_during(trainer, "create_optimizer", after=lambda a, k: (
                self._origin.note_built(trainer, a, k)))

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._trainer = _calling_trainer()
        origin = getattr(self, "_origin", None) or OptimizerOrigin()
        sources = origin.records(self._run.end_recording([optimizer]), optimizer, model)
        self._run.start(model, optimizer, main_process=state.is_world_process_zero,
                        first_step=state.global_step, sources=sources, say=logger.warning,
                        names=NAMES)

    def on_step_end(self, args, state, control, **kwargs):
        """A whole-run watch's new findings reach `Trainer.log` (TensorBoard, W&B, MLflow:
        whatever `report_to` names), as counts; `halt_on` stops training cleanly."""
        alerts = self._run.take_alerts()
        if alerts and self._trainer is not None and state.is_world_process_zero:
            try:
                self._trainer.log(alert_metrics(alerts))
            except Exception:  # the Trainer's loggers are theirs: never into its loop
                pass
        if self._run.should_stop:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self._run.stop()


def _calling_trainer():
    """The `Trainer` whose event this is. HF hands callbacks no trainer, only its parts, and
    `Trainer.log` is the one door to every logger `report_to` names: the trainer is the
    `self` of a frame above (its training loop calling the event). None if not found."""
    from transformers import Trainer
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _constructor_caller(trainer):
    """The frame that called `Trainer(...)` (above every `__init__` of `trainer`, a
    subclass's included), or None."""
    frame, caller = sys._getframe(1), None
    while frame is not None:
        if frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is trainer:
            caller = frame.f_back
        frame = frame.f_back
    return caller
