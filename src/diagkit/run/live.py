"""The live view of a watch (docs/workbook.md, "The live view"): a panel in the notebook that
follows the observed steps as the loop runs, then becomes the explorer of the diagnosis.

It must never slow the loop, so the loop's side is one clock read per observed step, and a
snapshot of what is already recorded (lists copied, no tensor read, no table built) at most
once per update. Everything else (the steps table, judging, the figure, the widgets' messages)
runs on the feed's own thread, and updates are throttled twice: at most one per `MIN_GAP`
seconds, and the feed's own work at most `DUTY` of the wall clock (an update that took 40 ms
waits 2 s before the next). Widget messages go out through the kernel's IOPub thread: nothing
waits on the front end.

Shown in a Jupyter kernel (`live=None`), or in any IPython with `live=True`; never elsewhere,
and ipywidgets is imported only when it is shown. Under a process group only rank 0 shows it,
from its own steps (every rank's are joined at the end, as always).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time

import pandas as pd

from ..core.errors import DiagkitError
from ..measure.step_records import StepRecords
from .pipeline import Observation, judge_observation

MIN_GAP = 0.25      # seconds between two updates at least: a few a second at most
DUTY = 0.02         # the share of the wall clock the feed's own work may take
KEEP_STEPS = 200    # observed steps of the problem tensors kept for the plot (whole run)


def check_live(live) -> None:
    if live is not None and not isinstance(live, bool):
        raise DiagkitError(f"live must be True, False or None (shown in a Jupyter kernel), "
                           f"got {live!r}")


def shown(live: bool | None) -> bool:
    """Whether a watch shows the live view: `live`, or (None) whether a Jupyter kernel runs
    this process. Read from `sys.modules`: nothing is imported to find out."""
    if live is False:
        return False
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    return bool(live) or ("ipykernel" in sys.modules and getattr(shell, "kernel", None)
                          is not None)


@dataclasses.dataclass
class Snapshot:
    """What the loop had recorded when an update was due, taken on the loop's thread."""

    records: StepRecords
    rows: list[dict]
    meta: dict
    observed: int
    findings: list | None   # a whole-run watch's findings so far (None: judge `records`)
    events: list[dict] | None


class LiveFeed:
    """One watch's live view: `recorded()` from the loop after each observed step, `finish()`
    with the result. `panel` is the widget; `updates`, `busy`, `last_cost`: how many updates
    were shown, the seconds the feed's thread spent on them, and on the latest."""

    def __init__(self, watch):
        from IPython.display import display

        from ..present.live_panel import LivePanel
        self._note = ("rank 0's steps (every rank's are joined at the end)"
                      if watch.channel is not None else "")
        self.watch, self.panel = watch, LivePanel(of=watch.steps, note=self._note)
        self.updates, self.busy, self.last_cost = 0, 0.0, 0.0
        self._next = 0.0                    # the monotonic time the next update may start
        self._slot: Snapshot | None = None
        self._final = None                  # (diagnosis,) once the watch ended
        self._wake = threading.Event()
        self._history = pd.DataFrame(columns=["step", "name", "grad_norm"])
        display(self.panel)
        self._thread = threading.Thread(target=self._run, name="diagkit-live", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the loop's side
    def recorded(self) -> None:
        """An observed step was recorded. Nearly free unless an update is due."""
        if time.monotonic() < self._next:
            return
        self._next = math.inf  # until the feed's thread is done with this one
        try:
            self._slot = self._snapshot()
        except Exception as exc:  # never into the watch: the view stops, the watch goes on
            self.panel.say(f"diagkit: the live view stopped: {type(exc).__name__}: {exc} "
                           "(the watch goes on)")
            return
        self._wake.set()

    def _snapshot(self) -> Snapshot:
        w = self.watch
        run = w.run
        observer = w.observer if run is None else run.observer
        parts = (observer.records.snapshot(), list(observer.inv.rows), w._meta(),
                 w.clock.observed)
        if run is None:
            return Snapshot(*parts, None, None)
        findings = run.timeline.findings()
        if run.ranks is not None and run.ranks.mismatch is not None:
            findings.append(run.ranks.mismatch)
        return Snapshot(*parts, findings, list(run.events))

    def finish(self, diagnosis) -> None:
        """The watch ended: the panel becomes the explorer of `diagnosis` (on the feed's
        thread, so the loop goes on at once)."""
        self._final = (diagnosis,)
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the panel shows the end; whether it does."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------ the feed's thread
    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            snap, self._slot = self._slot, None
            if snap is not None:
                self._update(snap)
            if self._final is not None:
                self._end(self._final[0])
                return

    def _update(self, snap: Snapshot) -> None:
        """Show `snap`; a failure is one line in the panel and ends the updates (never the
        watch)."""
        from ..present.live_panel import LiveView
        started = time.perf_counter()
        try:
            findings, steps = self._judged(snap)
            self.panel.show(LiveView(snap.observed, self.watch.steps, findings, steps,
                                     snap.events, self._note))
        except Exception as exc:
            self.panel.say(f"diagkit: the live view stopped: {type(exc).__name__}: {exc} "
                           "(the watch goes on)")
            return
        cost = time.perf_counter() - started
        self.updates, self.busy, self.last_cost = self.updates + 1, self.busy + cost, cost
        self._next = time.monotonic() + max(MIN_GAP, cost / DUTY)

    def _judged(self, snap: Snapshot) -> tuple[list, pd.DataFrame]:
        """The findings so far and the rows the plot draws from."""
        from ..present.live_panel import problem_names
        table = snap.records.table()
        if snap.findings is None:  # a watch of `steps`: judge what was recorded so far
            judged = judge_observation(Observation(snap.rows, table, None, snap.meta))
            return judged.findings, table[["step", "name", "grad_norm"]]
        names = problem_names(snap.findings)
        recent = table.loc[table["name"].isin(names), ["step", "name", "grad_norm"]]
        kept = pd.concat([self._history[self._history["name"].isin(names)], recent]) \
            if len(self._history) else recent
        kept = kept.drop_duplicates(["step", "name"], keep="last")
        self._history = kept[kept["step"].isin(sorted(kept["step"].unique())[-KEEP_STEPS:])]
        return snap.findings, self._history

    def _end(self, diagnosis) -> None:
        try:
            if diagnosis is None:
                self.panel.say("diagkit: the watch ended without a diagnosis")
                return
            from ..present.explorer import explore
            self.panel.become(explore(diagnosis))
        except Exception as exc:
            self.panel.say(f"diagkit: the explorer could not be shown: {type(exc).__name__}: "
                           f"{exc} (the diagnosis is in Watch.diagnosis)")
