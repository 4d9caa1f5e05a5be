"""`diagkit.watch`: observe the user's own training run in place (docs/watch.md, "Diagnose your real
training run").

    w = diagkit.watch(model, optimizer, steps=20, out="diag/")
    ... the user's loop, unchanged ...
    w.diagnosis            # a normal Diagnosis once `steps` optimizer steps were observed

The optimizers' step hooks tell the steps (`diagkit.measure.clock.step_clock`); after `steps` observed
steps every hook is removed and the result is judged as `diagnose` judges. Under an initialised
process group every rank observes and rank 0 gathers them (`diagkit.run.diagnose.gather`). Nothing it
does changes training: it only reads tensors, never writes them, and never raises into the loop.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ...core.errors import DiagkitError
from ...core.options import DEFAULTS
from ...core.result import Diagnosis
from ...measure.engines.ddp_facts import ddp_facts
from ...measure.model.inventory import take_inventory
from ...measure.step.observer import Observer
from ...measure.origin.provenance import watch_sources
from ...measure.origin.watch_call import watch_names
from ...measure.clock.run_clock import RunClock
from ...measure.clock.step_clock import StepClock
from ...measure.step.state import LoopFacts
from ...measure.engines.unwrap import compiled_entry
from . import ends as watch_ends, tracked as watch_trackers
from ..diagnose.gather import RankChannel, distributed
from ..live.view import LiveFeed, shown
from .options import check_watch_options, unwrapped
from .failed import detach_quietly, failed_diagnosis, stopped
from .save import save
from ..diagnose.pipeline import Observation, judge_observation
from .ranks import assemble
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
        self._busy, self._asked = 0, None  # inside the whole run's own work; an end asked then
        try:
            self._begin(model, optimizer_or_list, sample=sample, timeout=timeout,
                        on_finding=on_finding, halt_on=halt_on, caller=caller,
                        first_step=first_step, sources=sources,
                        trackers=(report_to, tracking))
        except DiagkitError:  # what the user passed: theirs to fix, nothing left attached
            detach_quietly(self.clock, self.observer)
            raise
        except Exception as exc:  # diagkit's own: training goes on unwatched
            self._unwatched(exc, "could not watch this run")
            return
        self.live = self._live(live)

    def _begin(self, model, optimizer_or_list, *, sample, timeout, on_finding, halt_on, caller,
               first_step, sources, trackers=(None, None)) -> None:
        """Take the inventory and set every hook. A `DiagkitError` is what the user passed
        (or an engine diagkit refuses); anything else is diagkit's own failure (`__init__`)."""
        steps, every = self.steps, self.every
        inner, self.wrappers, optimizers = unwrapped(model, optimizer_or_list)
        watch_ends.replace_earlier(self, inner, optimizers)  # a cell run again: one watch
        self.entry = compiled_entry(model)  # a compiled model's forward hook: on its wrapper
        self.inventory = take_inventory(inner, optimizers)
        # where the groups were built: recorded by a callback as the trainer built them, or
        # read from the caller's watch(...) statement
        self.sources = (sources if sources is not None else
                        watch_sources(caller, optimizers) if caller is not None else [])
        if not self.names and caller is not None:  # the fixes' names (README, "Reading a finding")
            self.names = watch_names(caller, model, inner, len(optimizers))
        if not self.inventory.tensors:
            raise DiagkitError("the model has no parameters and the optimizers hold none: "
                               "nothing to watch")
        self.channel = RankChannel() if distributed() else None
        if halt_on is not None and self.channel is not None:
            raise DiagkitError("halt_on cannot be used under a process group: a rank that "
                               "stops training alone leaves the others waiting in their "
                               "collectives (docs/whole-run.md, \"The whole run\")")
        if self.channel is not None:  # rank 0 joins them: pipeline stages differ
            self.channel.publish_rows(self.inventory.rows)
            self.channel.follow(self.inventory.tensors, optimizers)  # a rank that never steps
        self.timeout = timeout
        self._ddp = (model if isinstance(model, torch.nn.Module)
                     and "DistributedDataParallel" in self.wrappers else None)
        self.optimizers, self.sample = optimizers, sample
        self.run = None if steps is not None else WholeRun(
            self, inner, optimizers, every=every, halt_on=halt_on,
            on_finding=on_finding and partial(self._busily, on_finding))
        if self.run is None:
            self.observer = self.new_observer(self.inventory)
            self.clock = StepClock(self.observer, optimizers, steps=steps, every=every,
                                   on_step=self._published, on_done=self._finish)
        else:
            self.observer = self.run.observer
            self.clock = RunClock(self.observer, optimizers, plan=self._plan,
                                  on_done=self._finish, first_step=first_step)
        if self.channel is None or self.channel.rank == 0:  # only rank 0 sends
            self.trackers = watch_trackers.opened(*trackers, out=self.out)
        if self.run is None:
            self.observer.attach()
        self.clock.start()
        watch_ends.started(self)  # the process's end, however it comes, ends the watch too

    def _live(self, live: bool | None) -> LiveFeed | None:
        """The live view (rank 0 only), or None; one that cannot be shown is one line."""
        if not shown(live) or (self.channel is not None and self.channel.rank != 0):
            return None
        try:
            return LiveFeed(self)
        except Exception as exc:
            self.say(f"diagkit: the live view could not be shown: {type(exc).__name__}: {exc} "
                     "(the watch goes on)")
            return None

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
        that work is done (`_plan`): ending inside it judged and released the run under the
        window it was closing (issue 36, R19)."""
        if self._busy and not self._finished:
            self._asked = self._asked or how
            return None
        how = self._asked or how
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
        following = self._busily(self.run.plan, index, recorded)
        if self._asked is None:
            return following
        self._end(self._asked)
        return None

    def _busily(self, work, *args):
        """`work(*args)` with the whole run busy (`_end`): its plan, and its `on_finding`
        (called also where no plan is under it: an optimizer adopted in its first step)."""
        self._busy += 1
        try:
            return work(*args)
        finally:
            self._busy -= 1

    def _published(self, index: int) -> None:
        """An observed step was recorded: under a process group, publish it for rank 0; the
        live view may take a snapshot."""
        if self.live is not None:
            self.live.recorded()
        if self.channel is not None:
            observer = self.observer if self.run is None else self.run.observer
            columns = observer.step_columns(index)
            rank = np.full(len(columns["name"]), self.channel.rank, dtype=np.int64)
            # The wiring is compared across ranks by rank 0 (`whole_run.Ranks`).
            self.channel.publish_step({"rank": rank, **columns},
                                      None if self.run is None else self.run.wiring.digest())

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
        """`_finish`'s work: the observations become a `Diagnosis`, saved to `out`."""
        self.clock.stop()
        if self.run is None:  # the frozen base's read at the end (docs/cost.md)
            self.observer.close_window()
        self.observer.detach()
        if self.run is not None:
            self.run.finish()
        failure = None if error is None else stopped(self.clock.count, error)
        meta = self._meta()
        if self.run is None:
            meta["dropped_steps"] = [{"step": i, "why": why} for i, why in self.observer.dropped]
            # A step a loss scaler skipped ran on into the next one taken (`measure.step.skips`).
            meta["skipped_optimizer_steps"] = self.observer.skipped_optimizer_steps
        if self.channel is not None:
            if self.run is None:  # with the unregistered tensors found
                self.channel.publish_rows(self.observer.rows)
            self.channel.finish({"failure": failure, "observed": self.clock.observed,
                                 "optimizer_steps": self.clock.count})
            if self.channel.rank != 0:
                self._release()
                return
            steps, failure, ranks, rows = assemble(self.channel, self.timeout, failure,
                                                   self.observer.rows)
            meta.update(ranks=ranks, nproc=self.channel.world, backend=self.channel.backend)
            observation = (Observation(rows, steps, failure, meta)
                           if self.run is None else self.run.observation(failure, meta))
        elif self.run is not None:
            observation = self.run.observation(failure, meta)
        else:
            observation = Observation(self.observer.rows, self.observer.steps_table(), failure,
                                      meta)
        run = self.run
        self._release()
        self._diagnosis = judge_observation(observation, ddp=ddp_facts(self._ddp))
        if run is not None:
            self._diagnosis = run.result(self._diagnosis)
        self._save()
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
            self.run.result(judge_observation(observation, ddp=ddp_facts(self._ddp))
                            ).save(self.out)
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
        detach_quietly(self.clock, self.observer)
        self._finished, self._ended = True, "failed"
        meta = {**self._meta(), "ended": "failed"}
        self._diagnosis = failed_diagnosis(exc, what, error, meta, self.clock)
        self._release()
        save(self._diagnosis, self.out, report=False, ended="failed")  # no report of nothing

    def _release(self) -> None:
        """Drop the observer (its buffers and records go with it) and the process group's store:
        nothing of the watch outlives it."""
        if self.clock is not None:
            self.clock.obs = None
        self.observer = self.run = None
        self.channel = None

    def _meta(self) -> dict:
        return {"loop": "watch", "steps_requested": self.steps, "delta": self.delta,
                "optimizers": len(self.optimizers),
                "every": self.every,
                "optimizer_steps": 0 if self.clock is None else self.clock.count,
                **self._calls(),
                "wrappers": self.wrappers, "losses": [], "restored": False,
                "ended": self._ended,
                "seconds": round(time.perf_counter() - self._started, 4),
                "torch": torch.__version__,
                **({"optimizer_sources": self.sources} if self.sources else {}),
                **({"names": self.names} if self.names else {}),
                **self._over_budget()}

    def _calls(self) -> dict:
        """Each optimizer's own `step()` calls, and the steps that took more than one of
        some optimizer's (`optimizer_steps` counts the watch's steps: docs/result.md)."""
        if self.clock is None or not self.optimizers:
            return {}
        return {"optimizer_calls": list(self.clock.calls),
                **({"long_steps": list(self.clock.long_steps)} if self.clock.long_steps else {})}

    def _over_budget(self) -> dict:
        """The tensors `memory_budget` moved from a snapshot to the fingerprint (CUDA), by
        name, so the result says so (docs/cost.md)."""
        moved = getattr(getattr(self.observer, "probe", None), "over_budget", None) or []
        names = self.inventory.names if self.inventory is not None else []
        return {"over_budget": [names[k] for k in moved if k < len(names)]} if moved else {}

    def _save(self) -> None:
        """Write `out` (and the report): `watch_save.save`."""
        save(self._diagnosis, self.out, report=self.report, ended=self._ended)
