"""`diagkit.watch`: observe the user's own training run in place (docs/watch.md, "Diagnose your
real training run").

    w = diagkit.watch(model, optimizer, steps=20, out="diag/")
    ... the user's loop, unchanged ...
    w.diagnosis            # a normal Diagnosis once `steps` optimizer steps were observed

The optimizers' step hooks tell the steps (`diagkit.measure.clock.step_clock`); after `steps`
observed steps every hook is removed and the result is judged as `diagnose` judges. Under an
initialised process group every rank observes and rank 0 gathers them
(`diagkit.run.diagnose.gather`). Nothing it does changes training: it only reads tensors, never
writes them, and never raises into the loop.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

from ...core.errors import DiagkitError
from ...core.options import DEFAULTS
from ...core.result import Diagnosis
from ...measure.step.observer import Observer
from ...measure.clock.run_clock import RunClock
from ...measure.clock.step_clock import StepClock
from ...measure.step.state import LoopFacts
from . import ends as watch_ends, tracked as watch_trackers
from ..live.view import opened
from .begin import ddp_model, taken
from .deferred_end import DeferredEnd
from .options import check_watch_options
from .failed import detach_quietly, failed_diagnosis, stopped
from .observations import concluded, detach, judged, published, release
from .result_meta import watch_meta
from .save import save
from .whole_run import WholeRun


def watch(model, optimizer_or_list=None, *, steps: int | None = DEFAULTS["watch_steps"],
          every: int = DEFAULTS["every"], delta: str = DEFAULTS["delta"],
          sample: int = DEFAULTS["sample"], out=None, report: bool = False,
          timeout: float = DEFAULTS["timeout"], on_finding=None,
          halt_on: str | None = None, live: bool | None = None,
          memory_budget: float = DEFAULTS["memory_budget"], report_to=None) -> "Watch":
    """Observe the next `steps` observed optimizer steps of the user's own loop (steps 0,
    every, 2*every, ... counted from now), then detach and judge.

    `optimizer_or_list` None: a loop that updates its tensors by hand; a step then ends with
    each backward, or at each `Watch.step()` (docs/watch.md, "Hand-written updates").
    `steps=None`: the whole run, one step in `every` until `stop()` or the process's end, with
    each wiring change observed at once (`diagkit.run.watch.whole_run`; docs/whole-run.md, "The
    whole run").
    `on_finding(finding)`: called with each new warning or error as it appears; `halt_on`
    ("error", "warning"): `should_stop` turns True when such a finding appears (the callbacks
    then stop training). `live`: show the live view, a panel that follows the observed steps
    and becomes the explorer at the end (None: in a Jupyter kernel; `diagkit.run.live.view`).

    `model`, `optimizer_or_list`: as the loop holds them (DDP, DataParallel, `torch.compile`,
    accelerate and Lightning wrappers are seen through). `out`: a folder the diagnosis is saved
    to (`diagkit.load`); under a process group only rank 0 writes it. `report`: also render the
    HTML report into `out/report/` at the end (a notebook kernel runs for some seconds then).
    `timeout`: seconds rank 0 waits at the end for the other ranks' observations.
    `memory_budget`: on CUDA, the share of the free device memory exact mode's snapshots may
    take; past it the largest tensors are fingerprinted instead (`meta["over_budget"]`).
    `report_to`: the experiment trackers whose open runs get the status, the findings table
    and the alerts ("wandb", "tensorboard", "mlflow", "trackio", a list, "all", "none": the
    default; docs/integrations.md, "Trackers"), sent from a thread of their own, rank 0 only.
    The optimizers exist already: where their groups were built is read from the caller's
    `watch(...)` statement (`measure.origin.provenance.watch_sources`).
    """
    return Watch(model, optimizer_or_list, steps=steps, every=every, delta=delta,
                 sample=sample, out=out, report=report, timeout=timeout,
                 on_finding=on_finding, halt_on=halt_on, live=live, caller=sys._getframe(1),
                 memory_budget=memory_budget, report_to=report_to)


class Watch:
    """A watch in progress or done. `diagnosis`: the result (None on ranks other than 0);
    `stop()` ends it early; as a context manager it ends at the block's exit."""

    def __init__(self, model, optimizer_or_list, *, steps, every, delta, sample, out, report,
                 timeout, on_finding=None, halt_on=None, caller=None, first_step=0,
                 sources=None, live=None, memory_budget=DEFAULTS["memory_budget"],
                 names=None, report_to=None, tracking=None):
        check_watch_options(steps=steps, every=every, delta=delta, sample=sample, out=out,
                            report=report, timeout=timeout, on_finding=on_finding,
                            halt_on=halt_on, live=live, memory_budget=memory_budget,
                            report_to=report_to)
        self.memory_budget = memory_budget
        self.report, self.steps, self.every, self.delta = bool(report), steps, every, delta
        self.out = None if out is None else Path(out)
        self.wrappers, self.optimizers, self.sources, self.inventory = [], [], [], None
        self.names = names or {}  # the user's names for the model and optimizers (meta)
        self.run = self.observer = self.clock = self.channel = self.live = self.entry = None
        self.trackers = None  # report_to's trackers (rank 0): `watch_trackers`
        self._diagnosis: Diagnosis | None = None
        self._finished, self._started = False, time.perf_counter()
        self._ended = "steps"  # how it ended: steps, stop, exit, SIGTERM, failed (meta["ended"])
        self._deferred = DeferredEnd()  # an end asked inside the whole run's own work
        try:
            self._begin(model, optimizer_or_list, sample=sample, timeout=timeout,
                        on_finding=on_finding, halt_on=halt_on, caller=caller,
                        first_step=first_step, sources=sources,
                        trackers=(report_to, tracking))
        except DiagkitError:  # what the user passed: theirs to fix, nothing left attached
            detach_quietly(self.clock, self.observer, self.run)
            raise
        except Exception as exc:  # diagkit's own: training goes on unwatched
            self._unwatched(exc, "could not watch this run")
            return
        self.live = opened(self, live, meta=self._meta)

    def _begin(self, model, optimizer_or_list, *, sample, timeout, on_finding, halt_on, caller,
               first_step, sources, trackers=(None, None)) -> None:
        """Take the inventory (`begin.taken`) and set every hook. A `DiagkitError` is what the
        user passed (or an engine diagkit refuses); anything else is diagkit's own failure
        (`__init__`)."""
        steps, every = self.steps, self.every
        inner, optimizers = taken(self, model, optimizer_or_list, caller=caller,
                                  sources=sources, halt_on=halt_on)
        self.timeout, self._ddp = timeout, ddp_model(model, self.wrappers)
        self.optimizers, self.sample = optimizers, sample
        self.run = None if steps is not None else WholeRun(
            self, inner, optimizers, every=every, halt_on=halt_on,
            on_finding=on_finding and partial(self._deferred.busily, on_finding))
        if self.run is None:
            self.observer = self.new_observer(self.inventory)
            self.clock = StepClock(self.observer, optimizers, steps=steps, every=every,
                                   on_step=partial(published, self), on_done=self._finish)
        else:
            self.observer = self.run.observer
            self.clock = RunClock(self.observer, optimizers, plan=self._plan,
                                  on_done=self._finish, first_step=first_step)
        if self.channel is None or self.channel.rank == 0:  # only rank 0 sends
            self.trackers = watch_trackers.opened(*trackers, out=self.out)
        if self.run is None:
            self.observer.attach()
        self.clock.start()
        watch_ends.started(self, Watch._end)  # the process's end, however it comes, ends it too

    def new_observer(self, inventory) -> Observer:
        """An observer of `inventory` with this watch's options. Without a process group the
        loop may earn hookless reads (`EarnedShare`)."""
        return Observer(inventory, self.optimizers, delta=self.delta, sample=self.sample,
                        checksums=self.channel is not None, step_ends=True,
                        loop=LoopFacts(may_earn_shares=self.channel is None),
                        entry=self.entry, memory_budget=self.memory_budget)

    # ------------------------------------------------------------------ the user's side
    def step(self) -> None:
        """With no optimizer: the loop's own step ended here (call it after the update). The
        first call drops the step in progress; from then on these calls are the steps."""
        if self.optimizers:
            raise DiagkitError("watch.step() is for loops without an optimizer: here the "
                               "optimizers' own steps are the steps")
        if not self._finished:
            self.clock.step()

    @property
    def should_stop(self) -> bool:
        """Whether a finding at or above `halt_on` has appeared (a whole-run watch)."""
        return self.run is not None and self.run.should_stop

    @property
    def done(self) -> bool:
        """Whether observing has ended (every hook removed, the result judged)."""
        return self._finished

    @property
    def diagnosis(self) -> Diagnosis | None:
        """The result; reading it before the watch ended ends it (as `stop()`)."""
        if not self._finished:
            self.stop()
        return self._diagnosis

    def stop(self) -> Diagnosis | None:
        """End observing now (a step still in progress is dropped) and judge what was seen.
        Under a process group every rank must stop (training ending does it for them)."""
        return self._end("stop")

    def _end(self, how: str) -> Diagnosis | None:
        """`stop()`, saying why (`meta["ended"]`): "stop", or from `watch_ends` "exit" (the
        process is exiting) or "SIGTERM" (it is being terminated: no report is rendered).
        Asked while the whole run is inside its own work (its `on_finding` callback, or a
        signal that interrupted a window's judging), it returns None and the watch ends once
        that work is done (`_plan`; `deferred_end`)."""
        if not self._finished and self._deferred.held(how):
            return None
        how = self._deferred.asked or how
        if not self._finished:
            self._ended = how
        self._finish(None)
        if self.clock is not None and self.clock.hooks_left:  # an inert hook left by ending
            # inside it
            self.clock.stop()
        if self.trackers is not None:  # the user's end (a watch that ended in a step too)
            self.trackers.wait()
        return self._diagnosis

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        of = "" if self.steps is None else f" of {self.steps}"
        state = "done" if self._finished else f"watching ({self.clock.observed}{of} steps " \
                                              f"observed)"
        n = 0 if self.inventory is None else len(self.inventory.tensors)
        return f"<diagkit.Watch {n} tensors, {state}>"

    # ------------------------------------------------------------------ from the hooks
    def _plan(self, index: int, recorded: bool):
        """The whole run's `plan` for its clock: an end asked while it ran (`_end`) comes
        once it has returned, and then no step is observed next."""
        following = self._deferred.busily(self.run.plan, index, recorded)
        if self._deferred.asked is None:
            return following
        self._end(self._deferred.asked)
        return None

    def _finish(self, error: tuple[str, str] | None) -> None:
        """Detach everything, then (rank 0) gather, judge and save. Never raises into the
        loop: a result that cannot be saved is one line on stderr, and stays in `diagnosis`.
        Only once it is saved does the watch count as ended for `watch_ends` (a SIGTERM that
        comes meanwhile waits for the save)."""
        if self._finished:
            return
        self._finished = True
        try:
            self._conclude(error)
        except Exception as exc:  # diagkit's own: one line, and the failure in `diagnosis`
            self._unwatched(exc, "could not finish watching this run", error)
        finally:
            watch_ends.ended(self)
            if self.live is not None:  # the panel becomes the explorer (or says why not)
                self.live.finish(self._diagnosis)

    def _conclude(self, error: tuple[str, str] | None) -> None:
        """`_finish`'s work: the observations become a `Diagnosis`, saved to `out` (on rank 0:
        the other ranks only publish theirs)."""
        detach(self)
        failure = None if error is None else stopped(self.clock.count, error)
        run, observation = self.run, concluded(self, failure, self._meta())
        release(self)
        if observation is None:
            return
        self._diagnosis = judged(observation, self._ddp, run)
        save(self._diagnosis, self.out, report=self.report, ended=self._ended)
        # sent from the trackers' thread: `_end` waits for it, a training step does not
        watch_trackers.ended(self.trackers, self._diagnosis, whole_run=run is not None,
                             folder=self.out if self.report else None)

    def save_running(self) -> None:
        """A whole-run watch's diagnosis so far, saved to `out` while the run goes on (what
        `diagkit report --from` renders of a run still going). Never raises."""
        if self.out is None or (self.channel is not None and self.channel.rank != 0):
            return
        try:
            observation = self.run.observation(None, {**self._meta(), "ended": "running"})
            judged(observation, self._ddp, self.run).save(self.out)
        except Exception as exc:  # a full disk: said, and the run goes on
            self.say(f"diagkit: could not save the diagnosis so far to {self.out}: "
                     f"{type(exc).__name__}: {exc} (the watch goes on)")

    @staticmethod
    def say(line: str) -> None:
        """One line on stderr (`watch_ends.report`)."""
        watch_ends.report(line)

    def _unwatched(self, exc: Exception, what: str, error: tuple[str, str] | None = None
                   ) -> None:
        """Diagkit failed (not the user): every hook off, one line through the "diagkit"
        logger, and a diagnosis holding the failure; the user's training goes on unwatched.
        `error`: what had stopped observing before, if anything did."""
        detach_quietly(self.clock, self.observer, self.run)
        self._finished, self._ended = True, "failed"
        meta = {**self._meta(), "ended": "failed"}
        self._diagnosis = failed_diagnosis(exc, what, error, meta, self.clock)
        release(self)
        save(self._diagnosis, self.out, report=False, ended="failed")  # no report of nothing

    def _meta(self) -> dict:
        """The result's `meta` as the watch stands now (`result_meta.watch_meta`)."""
        return watch_meta(self, ended=self._ended, started=self._started)
