"""The Lightning callback, built on either Lightning package's `Callback` (see
`diagkit.integrations.lightning` for why there are two, and for use).

Why `on_train_start`: `trainer.optimizers` exist from `strategy.setup` on, but a checkpoint's
optimizer state is restored and the sanity check runs after `on_fit_start`; at
`on_train_start` everything is in place and no optimizer has stepped. `trainer.optimizers` are
the torch optimizers themselves; the LightningModule holds the parameters under their own names
(not the `_forward_module.` names of the strategy's wrapper). With automatic optimization the
forward and backward run inside `optimizer.step(closure)`: still one optimizer step per step,
accumulated batches (`accumulate_grad_batches`) included.

Trackers (`report_to`, docs/integrations.md "Trackers"): by default `trainer.loggers`, each as
the object it opened: a `TensorBoardLogger`'s writer (`.experiment`), a `WandbLogger`'s run, an
`MLFlowLogger`'s client and run id; other loggers (CSV, ...) are left out. Lightning logs an
optimizer step's values at the step count before it (`_batches_that_stepped`), so diagkit's
value for a step lands there too. Its callbacks' `on_train_end` (and `on_exception`) run before
the loggers' `finalize`: the watch ends and its trackers are waited for there.
"""

from __future__ import annotations

import importlib
import warnings

from . import Watching, alert_metrics, require
from ._tracking import chosen, context

# Lightning's loggers diagkit sends to (a class of that name in the logger's MRO): the
# `report_to` word, and what to send to.
LOGGERS = {"TensorBoardLogger": ("tensorboard", lambda lg: lg.experiment),
           "WandbLogger": ("wandb", lambda lg: lg.experiment),
           "MLFlowLogger": ("mlflow", lambda lg: (lg.experiment, lg.run_id))}


def callback_class(package: str, module: str, install: str) -> type:
    """`DiagkitCallback` on `package`'s Callback ("lightning.pytorch" or "pytorch_lightning"),
    as the diagkit module `module` exports it."""
    framework = require(package, module, install)
    top = package.split(".")[0]
    warn = importlib.import_module(f"{package}.utilities.rank_zero").rank_zero_warn

    class DiagkitCallback(framework.Callback, Watching):
        """Watch the Trainer's fit. Keyword arguments are `diagkit.watch`'s (`steps`, `every`,
        `delta`, `sample`, `out`, ...), passed to it unchanged and checked now.

        It detaches by itself after `steps` observed optimizer steps, or when training ends or
        raises. `watch`: the `diagkit.Watch` of the last fit; `diagnosis`: its result (None on
        ranks other than 0). Only the global-zero process writes `out`. What diagkit refuses
        to watch as training begins is one `rank_zero_warn` line (`refused` keeps it) and the
        fit goes on unwatched; a bad option raises here.
        """

        def __init__(self, **watch_options):
            super().__init__()
            self._start_watching(watch_options)

        def setup(self, trainer, pl_module, stage):
            """Lightning calls the user's `configure_optimizers` after this and before
            `on_train_start`: where its groups are built is noted meanwhile, so a finding
            about membership shows the user's lines there."""
            if stage == "fit":
                self._run.record_sources()

        def teardown(self, trainer, pl_module, stage):
            self._run.end_recording()

        def on_train_start(self, trainer, pl_module):
            theirs = type(trainer).__module__.split(".")[0]
            if theirs != top:  # works (Lightning duck-types callbacks), but is the wrong class
                warnings.warn(f"diagkit: this DiagkitCallback is {top}'s but the Trainer is "
                              f"{theirs}'s; import it from diagkit.integrations.{theirs}",
                              stacklevel=2)
            optimizers = list(trainer.optimizers)
            names = {"model": "trainer.lightning_module",  # what a fix calls them
                     "optimizers": [f"trainer.optimizers[{i}]" for i in range(len(optimizers))]}
            main = trainer.is_global_zero
            self._run.start(pl_module, optimizers, main_process=main,
                            first_step=trainer.global_step, say=warn, names=names,
                            tracking=self._tracking(trainer) if main else None)

        def _tracking(self, trainer):
            """The watch's trackers: `report_to` (None: `trainer.loggers`). None, said, if
            the loggers cannot be read."""
            try:
                return context(chosen(self._run.options.get("report_to"), loggers(trainer)),
                               framework="lightning", after=0,
                               out=self._run.options.get("out"), say=warn,
                               loggers=list(trainer.loggers), **board_dir(trainer))
            except Exception as exc:  # never into the fit: the watch goes on without them
                warn(f"diagkit: could not read the Trainer's loggers: "
                     f"{type(exc).__name__}: {exc}")
                return None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            """A whole-run watch's new findings reach the progress bar, as counts (the
            loggers get diagkit's series through `report_to`); `halt_on` stops training
            cleanly (`trainer.should_stop`)."""
            alerts = self._run.take_alerts()
            if alerts:
                metrics = alert_metrics(alerts)
                try:
                    for key, value in metrics.items():
                        pl_module.log(key, value, prog_bar=key.endswith("s"), logger=False,
                                      reduce_fx="max")
                except Exception:  # Lightning's: never into its loop
                    pass
            if self._run.should_stop:
                trainer.should_stop = True

        def on_train_end(self, trainer, pl_module):
            self._run.stop()

        def on_exception(self, trainer, pl_module, exception):
            self._run.stop()  # the steps before the error are kept and judged (and the
            # recording of the optimizers' construction, if the fit failed before, ends)

    DiagkitCallback.__module__ = module
    DiagkitCallback.__qualname__ = "DiagkitCallback"
    return DiagkitCallback


def loggers(trainer) -> list[tuple[str, object]]:
    """`trainer.loggers` diagkit sends to, as (`report_to` word, what to send to); the others
    (CSV, comet, ...) left out."""
    found = []
    for logger in trainer.loggers:
        names = {k.__name__ for k in type(logger).__mro__}
        for cls, (word, item) in LOGGERS.items():
            if cls in names:
                found.append((word, item(logger)))
                break
    return found


def board_dir(trainer) -> dict:
    """Where diagkit's own TensorBoard writer would write (a `TensorBoardLogger`'s log dir)."""
    for logger in trainer.loggers:
        if "TensorBoardLogger" in {k.__name__ for k in type(logger).__mro__}:
            return {"tensorboard_dir": logger.log_dir}
    return {}
