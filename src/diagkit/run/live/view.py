"""The live view of a watch (docs/workbook.md, "The live view"): a panel in the notebook that
follows the observed steps as the loop runs, then becomes the explorer of the diagnosis.

It must never slow the loop, so the loop's side is one clock read per observed step, and a
snapshot of what is already recorded (lists copied, no tensor read, no table built) at most
once per update. Everything else runs on the feed's own thread, in two kinds of work:

- an **update** shows what is cheap and incremental: the step count, the findings known, the
  grad norms of the steps recorded since the last update (`live_trail`). At most one per
  `MIN_GAP` seconds (a few a second), each followed by a wait of `cost / (DUTY / 2)` at least.
- **judging** a watch of `steps` steps (the verdicts on everything recorded so far, 30-200 ms)
  is followed by a wait of `cost / (DUTY / 2)` before the next (one of 60 ms waits 6 s; the
  first comes with the first update); between two, the updates go on with the findings of the
  last. A whole-run watch judges its own windows as it goes: the panel shows its findings as
  they are.

The feed's work holds the GIL, and so takes from the loop what it takes from the clock: the
updates and judging together take at most `DUTY` of it. When the watch ends, the panel shows
the final count and findings at once, and the explorer (a few hundred ms of widgets) is built
when the loop leaves the cell (IPython's `post_run_cell`), or by `join()`; a watch that ends
outside a running cell builds it on the feed's thread. Widget messages go out through the
kernel's IOPub thread: nothing waits on the front end.

Shown in a Jupyter kernel (`live=None`), or in any IPython with `live=True`; never elsewhere,
and ipywidgets is imported only when it is shown. Under a process group only rank 0 shows it,
from its own steps (every rank's are joined at the end, as always). The view is the workbook
extra's (README, "Install"): without it, `live=None` in a kernel falls back to the log lines
as outside one, and `live=True` is refused by `watch` in one line saying to install it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

from ...core import extras
from ...core.errors import DiagkitError
from ...measure.tables.step_records import StepRecords
from .cells import Cells
from .trail import Trail
from ..diagnose.pipeline import Observation, judge_observation

MIN_GAP = 0.25      # seconds between two updates at least: a few a second at most
DUTY = 0.02         # the share of the wall clock the feed's own work may take in all


def check_live(live) -> None:
    """`live` is True, False or None; True asks for the panel, so without the workbook extra
    it is one line saying to install it, before anything is attached."""
    if live is not None and not isinstance(live, bool):
        raise DiagkitError(f"live must be True, False or None (shown in a Jupyter kernel), "
                           f"got {live!r}")
    if live:
        extras.need(extras.EXPLORER, "live=True (the live view)")


def shown(live: bool | None) -> bool:
    """Whether a watch shows the live view: `live`, or (None) whether a Jupyter kernel runs
    this process and the workbook's widgets are installed (else the log lines, as outside a
    kernel). Read from `sys.modules` and the path: nothing is imported to find out."""
    if live is False:
        return False
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    if live:
        return True
    return ("ipykernel" in sys.modules and getattr(shell, "kernel", None) is not None
            and not extras.missing(extras.EXPLORER))


def opened(watch, live: bool | None, meta) -> LiveFeed | None:
    """The live view of `watch` (rank 0 only: `shown`), or None; one that cannot be shown is
    one line (`watch.say`). `meta`: the watch's builder of its result's `meta`, called for
    each snapshot."""
    if not shown(live) or (watch.channel is not None and watch.channel.rank != 0):
        return None
    try:
        return LiveFeed(watch, meta)
    except Exception as exc:
        watch.say(f"diagkit: the live view could not be shown: {type(exc).__name__}: {exc} "
                  "(the watch goes on)")
        return None


@dataclasses.dataclass
class Snapshot:
    """What the loop had recorded when an update was due, taken on the loop's thread.
    `source`: the recording object `records` copies (a whole run's window)."""

    records: StepRecords
    source: object
    rows: list[dict]
    meta: dict
    observed: int
    findings: list | None   # a whole-run watch's findings so far (None: judge `records`)
    events: list[dict] | None


class LiveFeed:
    """One watch's live view: `recorded()` from the loop after each observed step, `finish()`
    with the result. `panel` is the widget; `updates`, `judged`, `busy`, `last_cost`: how many
    updates were shown, how many of them judged, the seconds the feed's thread spent on them,
    and on the latest (`last_tick`, `last_judge`: on the latest of each kind). `meta`: the
    watch's builder of its result's `meta` (the judging of a snapshot needs it)."""

    def __init__(self, watch, meta):
        from IPython.display import display

        from ...present.live_panel import LivePanel
        self._rank = ("rank 0's steps (every rank's are joined at the end)"
                      if watch.channel is not None else "")
        self.watch, self.panel = watch, LivePanel(of=watch.steps, note=self._rank)
        self._meta = meta
        self.updates, self.judged, self.busy, self.last_cost = 0, 0, 0.0, 0.0
        self.last_tick = self.last_judge = 0.0  # the latest update's cost without, with judging
        self._next = 0.0                    # the monotonic time the next update may start
        self._next_judge = 0.0              # ... and the next judging
        self._judged_at = -1                # the records judged last (how many)
        self._slot: Snapshot | None = None
        self._final = None                  # (diagnosis,) once the watch ended
        self._findings: list = []           # the findings shown (the last judged)
        self._stopped = False               # the view failed: no more updates
        self._wake = threading.Event()
        self.trail = Trail()
        display(self.panel)
        self.cells = Cells(self)            # the notebook's cells: when the loop leaves one
        self._thread = threading.Thread(target=self._run, name="diagkit-live", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the loop's side
    def recorded(self) -> None:
        """An observed step was recorded. Nearly free unless an update is due."""
        if time.monotonic() < self._next:
            return
        self._next = float("inf")  # until the feed's thread is done with this one
        try:
            self._slot = self._snapshot()
        except Exception as exc:  # never into the watch: the view stops, the watch goes on
            self._stop(exc)
            return
        self._wake.set()

    def _snapshot(self) -> Snapshot:
        w = self.watch
        run = w.run
        observer = w.observer if run is None else run.observer
        parts = (observer.records.snapshot(), observer.records, list(observer.inv.rows),
                 self._meta(), w.clock.observed)
        if run is None:
            return Snapshot(*parts, None, None)
        findings = run.spans()
        if run.ranks is not None and run.ranks.mismatch is not None:
            findings.append(run.ranks.mismatch)
        return Snapshot(*parts, findings, list(run.events))

    def finish(self, diagnosis) -> None:
        """The watch ended: the panel shows the end (on the feed's thread, so the loop goes
        on at once), and becomes the explorer of `diagnosis` when the loop leaves the cell."""
        self._final = (diagnosis,)
        self._wake.set()

    @property
    def ending(self) -> bool:
        """Whether the watch has ended (the panel shows the end, or is about to)."""
        return self._final is not None

    def wait_shown(self, timeout: float | None = None) -> bool:
        """Wait until the feed's thread has shown the end (the explorer aside)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the panel shows the end, the explorer included (built here if the cell
        has not ended yet: the caller is waiting for it); whether it does."""
        if not self.wait_shown(timeout):
            return False
        self.cells.show_explorer()
        return True

    # ------------------------------------------------------------ the feed's thread
    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            snap, self._slot = self._slot, None
            if snap is not None and not self._stopped:
                try:
                    self._update(snap)
                except Exception as exc:  # noqa: BLE001  the view's own bug: it stops
                    self._stop(exc)
            if self._final is not None:
                self._end(self._final[0])
                return

    def _update(self, snap: Snapshot) -> None:
        """Show `snap`; a failure is one line in the panel and ends the updates (never the
        watch)."""
        started = time.perf_counter()
        try:
            self.trail.take(snap.records, snap.source)
            judging = snap.findings is None and self._judge_due(len(snap.records))
            if judging:
                judged = judge_observation(Observation(snap.rows, snap.records.table(), None,
                                                       snap.meta))
                self._findings = judged.findings
            elif snap.findings is not None:
                self._findings = snap.findings
            self._show(snap.observed, snap.events, self.cells.note())
        except Exception as exc:
            self._stop(exc)
            return
        now, cost = time.monotonic(), time.perf_counter() - started
        self.updates, self.busy, self.last_cost = self.updates + 1, self.busy + cost, cost
        # Half of DUTY each: the updates wait at least cost / (DUTY / 2) after each, and so
        # does the judging; so the feed's work, but the latest of each, stays within DUTY.
        if judging:
            self.judged, self._judged_at = self.judged + 1, len(snap.records)
            self.last_judge = cost
            self._next_judge = now + cost / (DUTY / 2)
            self._next = now + MIN_GAP
        else:
            self.last_tick = cost
            self._next = now + max(MIN_GAP, cost / (DUTY / 2))

    def _judge_due(self, recorded: int) -> bool:
        """Whether to judge now (a watch of `steps` steps): something new was recorded since
        the last judging, and its wait is over."""
        return recorded != self._judged_at and time.monotonic() >= self._next_judge

    def refresh(self) -> None:
        """Show the panel again now (a cell ended: the note changed), from the caller's
        thread while the loop is not stepping."""
        if self._final is None and not self._stopped:
            try:
                self._slot = self._snapshot()
            except Exception as exc:
                self._stop(exc)
                return
            self._wake.set()

    def _show(self, observed: int, events, note: str) -> None:
        """The panel, from the findings known and the grad norms kept."""
        from ...present.live_panel import LiveView, problem_names
        names = problem_names(self._findings)
        lines = self.trail.lines(names) if names else []
        whole = not lines
        self.panel.show(LiveView(observed, self.watch.steps, self._findings,
                                 lines or self.trail.whole(), whole, events,
                                 " · ".join(p for p in (self._rank, note) if p)))

    def _stop(self, exc: Exception) -> None:
        self._stopped = True
        self.panel.say(f"diagkit: the live view stopped: {type(exc).__name__}: {exc} "
                       "(the watch goes on)")

    def _end(self, diagnosis) -> None:
        """The final count and findings, at once; the explorer now if no cell is running,
        else when the cell ends (`live_cells.Cells`)."""
        if diagnosis is not None and not self._stopped:
            try:
                self._findings = list(diagnosis.findings)
                events = diagnosis.meta.get("events") if self.watch.steps is None else None
                self._show(self.watch.clock.observed if self.watch.clock is not None else 0,
                           events, self.cells.ended_note())
            except Exception as exc:
                self._stop(exc)
        self.trail.release()
        self.cells.ended(diagnosis)

    def show_explorer(self, diagnosis) -> None:
        """The panel becomes the explorer of `diagnosis` (or says why not): on the thread
        `live_cells.Cells` picks, once."""
        try:
            if diagnosis is None:
                self.panel.say("diagkit: the watch ended without a diagnosis")
                return
            from ...present.explorer import explore
            self.panel.become(explore(diagnosis))
        except Exception as exc:
            self.panel.say(f"diagkit: the explorer could not be shown: {type(exc).__name__}: "
                           f"{exc} (the diagnosis is in Watch.diagnosis)")
