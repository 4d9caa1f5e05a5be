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

Trackers (`report_to`, docs/integrations.md "Trackers"): by default those of `args.report_to`
that diagkit knows; TensorBoard through the writer HF's `TensorBoardCallback` opened. The Trainer
logs a step's values at `state.global_step` after it: diagkit's value for the same step lands
there too. HF calls its tracker callbacks before the user's, and at `on_train_end` they end
their runs and close their writer: so as training begins this callback moves itself to the
front of the Trainer's callbacks (back to its place as training ends), and at `on_train_end`
it ends the watch and waits for its trackers before theirs close.
"""

from __future__ import annotations

import sys

from . import Watching, require
from ._trainer_optimizer import OptimizerOrigin
from ._tracking import chosen, context, known

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
        self._start_watching(watch_options, keep_alerts=False)
        self._trainer, self._place = None, None

    def on_init_end(self, args, state, control, **kwargs):
        """The Trainer builds its optimizer inside `train()`, in `create_optimizer`, before
        `on_train_begin`: where its groups are built is noted during that call (a
        `create_optimizer` the user overrode is then the finding's lever;
        `measure.origin.provenance`), and what the Trainer's own built from as it returns. An
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
        main = state.is_world_process_zero
        self._run.start(model, optimizer, main_process=main, first_step=state.global_step,
                        sources=sources, say=logger.warning, names=NAMES,
                        tracking=self._tracking(args) if main else None)
        self._to_front()

    def on_step_end(self, args, state, control, **kwargs):
        """`halt_on` stops training cleanly."""
        if self._run.should_stop:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        """Before HF's tracker callbacks end their runs (this one runs first): the watch's
        end is judged, saved and sent."""
        self._run.stop()
        self._back_in_place()

    def _tracking(self, args):
        """The watch's trackers: `report_to` (None: `args.report_to`, by then a list of
        names), TensorBoard as the writer HF's `TensorBoardCallback` opened (its
        `on_train_begin` ran before this one's). None, said, if they cannot be read."""
        try:
            return self._trackers(args)
        except Exception as exc:  # never into the Trainer: the watch goes on without them
            logger.warning("diagkit: could not read the Trainer's trackers: %s: %s",
                           type(exc).__name__, exc)
            return None

    def _trackers(self, args):
        handler = getattr(self._trainer, "callback_handler", None)
        board = next((c for c in getattr(handler, "callbacks", ())
                      if any(k.__name__ == "TensorBoardCallback" for k in type(c).__mro__)),
                     None)
        writer = getattr(board, "tb_writer", None)
        framework = [(w, writer if w == "tensorboard" and writer is not None else w)
                     for w in known(args.report_to or [])]
        objects = {"trainer": self._trainer}
        if getattr(board, "logging_dir", None):
            objects["tensorboard_dir"] = board.logging_dir
        return context(chosen(self._run.options.get("report_to"), framework),
                       framework="transformers", after=1, out=self._run.options.get("out"),
                       say=logger.warning, **objects)

    def _to_front(self) -> None:
        """First among the Trainer's callbacks, so that this one's `on_train_end` comes before
        the trackers' (they close their runs there). The handler is iterating its list now:
        a new list takes its place, the loop goes on over the old one."""
        handler = getattr(self._trainer, "callback_handler", None)
        if handler is None or self not in handler.callbacks or handler.callbacks[0] is self:
            return
        self._place = handler.callbacks.index(self)
        handler.callbacks = [self] + [c for c in handler.callbacks if c is not self]

    def _back_in_place(self) -> None:
        """Where the user put this callback: a next `train()` begins after HF's trackers
        again (the TensorBoard writer is opened anew there)."""
        handler, place, self._place = getattr(self._trainer, "callback_handler", None), \
            self._place, None
        if handler is None or place is None or self not in handler.callbacks:
            return
        others = [c for c in handler.callbacks if c is not self]
        handler.callbacks = others[:place] + [self] + others[place:]


def _calling_trainer():
    """The `Trainer` whose event this is. HF hands callbacks no trainer, only its parts, and
    its callback handler (the order of the events) and its trackers are the trainer's: the
    trainer is the `self` of a frame above (its training loop calling the event). None if not
    found."""
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
