"""The Lightning callback, built on either Lightning package's `Callback` (see
`diagkit.integrations.lightning` for why there are two, and for use).

Why `on_train_start`: `trainer.optimizers` exist from `strategy.setup` on, but a checkpoint's
optimizer state is restored and the sanity check runs after `on_fit_start`; at
`on_train_start` everything is in place and no optimizer has stepped. `trainer.optimizers` are
the torch optimizers themselves; the LightningModule holds the parameters under their own names
(not the `_forward_module.` names of the strategy's wrapper). With automatic optimization the
forward and backward run inside `optimizer.step(closure)`: still one optimizer step per step,
accumulated batches (`accumulate_grad_batches`) included.
"""

from __future__ import annotations

import importlib
import warnings

from . import Watching, alert_metrics, require


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
            self._run.start(pl_module, optimizers, main_process=trainer.is_global_zero,
                            first_step=trainer.global_step, say=warn, names=names)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            """A whole-run watch's new findings reach `trainer.logger` and the progress bar,
            as counts; `halt_on` stops training cleanly (`trainer.should_stop`)."""
            alerts = self._run.take_alerts()
            if alerts:
                metrics = alert_metrics(alerts)
                try:
                    if trainer.logger is not None:
                        trainer.logger.log_metrics(metrics, step=trainer.global_step)
                    for key, value in metrics.items():
                        pl_module.log(key, value, prog_bar=key.endswith("s"), logger=False,
                                      reduce_fx="max")
                except Exception:  # Lightning's loggers are theirs: never into its loop
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
