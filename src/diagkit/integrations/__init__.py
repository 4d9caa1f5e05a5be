"""Callbacks that put `diagkit.watch` on the training loops of frameworks (optional extras).

    from diagkit.integrations.transformers import DiagkitCallback  # diagkit[transformers]
    from diagkit.integrations.lightning import DiagkitCallback     # diagkit[lightning]
    from diagkit.integrations.pytorch_lightning import DiagkitCallback  # pytorch_lightning

Each module imports its framework itself, so the rest of diagkit never does (a test checks
that `import diagkit` loads none of them). accelerate needs no callback: `watch` sees through
what `accelerator.prepare` returns.

What the callbacks share lives here: checking watch's keyword arguments when the callback is
built (a typo must fail before the model loads, not minutes later when training begins), and
one `Attachment` per training run. Once training has begun nothing of diagkit raises into it:
what diagkit refuses to watch then (an engine it does not know, an optimizer of flat buffers)
is one line through the framework's logger, and training goes on unwatched
(docs/integrations.md, "In a Hugging Face `Trainer`, Lightning or accelerate run").
"""

from __future__ import annotations

import contextlib
import importlib
import inspect

from ..core.errors import DiagkitError
from ..core.format import brief
from ..measure.origin.provenance import record_optimizer_sources, sources_for
from ..run.diagnose.gather import distributed
from ..run.watch.watch import Watch, check_watch_options, watch


def alert_metrics(findings) -> dict[str, float]:
    """What Lightning's progress bar shows of new findings: one count per severity and per
    verdict, under `diagkit/` (the loggers get diagkit's own series through `report_to`)."""
    metrics: dict[str, float] = {}
    for f in findings:
        for key in (f"diagkit/{f.severity}s", f"diagkit/{f.code}"):
            metrics[key] = metrics.get(key, 0.0) + 1.0
    return metrics


def require(module: str, user: str, install: str):
    """Import a framework for `user` (a diagkit module), or one line saying how to install it
    (`install`: "diagkit[transformers]", ...)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DiagkitError(f"{user} needs {module} ({exc}): pip install {install}") from None


def checked_options(options: dict, who: str) -> dict:
    """`options` for `watch(model, optimizers, **options)`, checked as watch checks them.

    Names are taken from watch's own signature, so an option watch gains later passes through
    unchanged; values go through watch's own checks (`check_watch_options`).
    """
    params = inspect.signature(watch).parameters
    allowed = [name for name, p in params.items() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise DiagkitError(f"{who} got unknown option{'s' * (len(unknown) > 1)} "
                           f"{', '.join(map(repr, unknown))}; diagkit.watch takes "
                           f"{', '.join(allowed)}")
    check_watch_options(**{name: options.get(name, params[name].default) for name in allowed})
    return dict(options)


class Attachment:
    """The watch of one training run of a framework's trainer: started as training begins,
    stopped as it ends (a second `fit()`/`train()` gets a new one)."""

    def __init__(self, options: dict, keep_alerts: bool = True):
        self.options, self.keep_alerts = options, keep_alerts
        self.watch: Watch | None = None
        self.refusal: str | None = None  # why the last run goes unwatched (None: watched)
        self.alerts: list = []   # new findings of a whole-run watch, for the framework's logger
        self._recording = None   # (context, recorder) while the trainer builds its optimizers
        self._recorded = None    # the recorder of a `record_during` call that has ended

    def record_sources(self) -> None:
        """Note where the optimizers' groups are built from now until `start` (the trainer
        calls the user's `configure_optimizers` in between; `measure.origin.provenance`)."""
        self.end_recording()
        context = record_optimizer_sources()
        self._recording = (context, context.__enter__())

    def record_during(self, owner, name: str, after=None) -> None:
        """Note where the groups are built only while `owner.<name>(...)` runs, once (the
        HF Trainer's `create_optimizer`): an instance attribute stands in for the method and
        takes itself off at that call, so no patch outlives it, even if it never comes.
        `after(args, kwargs)`: called as the call returns, to note what it built then."""
        if name in vars(owner):
            return
        original, attachment = getattr(owner, name), self

        def during(*args, **kwargs):
            vars(owner).pop(name, None)
            with record_optimizer_sources() as recorder:
                try:
                    result = original(*args, **kwargs)
                finally:
                    attachment._recorded = recorder
            if after is not None:
                with contextlib.suppress(Exception):  # an extra: never into the trainer
                    after(args, kwargs)
            return result
        setattr(owner, name, during)

    def end_recording(self, optimizers=()) -> list:
        """Stop noting (the patches come off, whatever happens next) and return the records
        of `optimizers`' groups; [] when nothing was recorded."""
        recorder, self._recorded = self._recorded, None
        if self._recording is not None:
            (context, recorder), self._recording = self._recording, None
            context.__exit__(None, None, None)
        if recorder is None:
            return []
        unwrapped = [getattr(o, "optimizer", o) for o in optimizers]
        return sources_for(recorder, unwrapped)

    def start(self, model, optimizers, *, main_process: bool, say, first_step: int = 0,
              sources=None, names=None, tracking=None) -> Watch | None:
        """Watch `model` under `optimizers`, or say in one line (`say(line)`: the framework's
        logger) why not and let training go on unwatched (None): training has begun, and a
        long job must never die of its diagnostic tool. Only the main process writes `out`
        (`_watch`). `names`: what a fix calls the model and the optimizers there
        (`meta["names"]`: `trainer.model`, ...), as the user reaches them after training.
        `tracking`: the framework's trackers (`_tracking.context`), sent to by the main
        process only."""
        self.refusal = None
        try:
            return self._watch(model, optimizers, main_process, first_step, sources, names,
                               tracking)
        except Exception as exc:  # a refusal (DiagkitError) or diagkit's own failure
            self.watch, self.refusal = None, (f"diagkit: not watching this run: "
                                              f"{type(exc).__name__}: {brief(exc, 600)}")
            with contextlib.suppress(Exception):  # the framework's logger: never into its loop
                say(self.refusal + " (training goes on unwatched)")
            return None

    def _watch(self, model, optimizers, main_process: bool, first_step: int, sources,
               names=None, tracking=None) -> Watch:
        """`start`'s watch. Under a process group watch itself leaves `out` to rank 0 (every
        rank must still watch, to be gathered); without one (several processes that share no
        group) the others get no `out`. `first_step`: the trainer's global step (a resumed run
        goes on counting from it). `sources`: the groups' records when the callback made them
        (else the recording's)."""
        recorded = self.end_recording(optimizers if isinstance(optimizers, (list, tuple))
                                      else [optimizers])
        sources = recorded if sources is None else sources
        self.stop()
        if optimizers is None or (isinstance(optimizers, (list, tuple)) and not optimizers):
            raise DiagkitError("the trainer has no optimizer yet: nothing to watch")
        params = inspect.signature(watch).parameters
        options = {name: self.options.get(name, p.default) for name, p in params.items()
                   if p.kind is p.KEYWORD_ONLY}
        if not main_process and not distributed():
            options["out"] = None
        if not main_process:  # only the main process sends (under a group, watch checks too)
            options["report_to"], tracking = None, None
        if tracking is not None:  # report_to is resolved in it (`_tracking.chosen`)
            options["report_to"] = None
            if options["steps"] is not None:  # it counts its steps from 0, not the global step
                tracking.step_offset += first_step
        users = options["on_finding"]
        options["on_finding"] = lambda finding: self._alert(finding, users)
        self.alerts = []
        self.watch = Watch(model, optimizers, **options, first_step=first_step,
                           sources=sources or None, names=names, tracking=tracking)
        return self.watch

    def _alert(self, finding, users) -> None:
        """A new finding: kept for the callback to show at its next event, then the user's."""
        if self.keep_alerts:
            self.alerts.append(finding)
        if users is not None:
            users(finding)

    def take_alerts(self) -> list:
        """The findings announced since the last call (for the framework's logger)."""
        taken, self.alerts = self.alerts, []
        return taken

    @property
    def should_stop(self) -> bool:
        """`halt_on` was reached: the callback stops training cleanly."""
        return self.watch is not None and not self.watch.done and self.watch.should_stop

    def stop(self) -> None:
        """End the watch (judge and save what it saw); nothing if none runs. Then wait
        (bounded) until its trackers have what it sent: the framework closes its own trackers
        right after (docs/integrations.md, "Trackers")."""
        self.end_recording()
        if self.watch is not None:  # a watch that ended in a step: stop() still waits
            self.watch.stop()

    @property
    def diagnosis(self):
        """The last run's `Diagnosis` (None before training, and on ranks other than 0)."""
        return None if self.watch is None else self.watch.diagnosis


class Watching:
    """What every callback exposes: its options checked as it is built, `watch` (the
    `diagkit.Watch` of the last training run) and `diagnosis` (its result)."""

    def _start_watching(self, options: dict, keep_alerts: bool = True) -> None:
        self._run = Attachment(checked_options(options, "DiagkitCallback"), keep_alerts)

    @property
    def watch(self):
        return self._run.watch

    @property
    def diagnosis(self):
        return self._run.diagnosis

    @property
    def refused(self) -> str | None:
        """Why the last training run went unwatched (the line logged), None if it was watched."""
        return self._run.refusal
