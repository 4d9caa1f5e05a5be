"""What a watch holds of its trackers (`Watch.trackers`): it turns the watch's moments (a window
judged, a new finding, the end) into the sinks' calls, sent off the loop (`sender.Sender`)."""

from __future__ import annotations

import atexit
import time
import weakref

from ...present import tracked
from .choose import open_sinks
from .sender import Sender

# How long an end waits for its trackers, at most.
WAIT_SECONDS = 30.0


class Trackers:
    """The trackers of one watch (rank 0 only). Never raises into the loop."""

    def __init__(self, sinks: list, context):
        # Exit hooks run last-registered first: registered again here, diagkit's wait comes
        # before the finish hooks of the trackers' runs opened until now (W&B's, Trackio's).
        atexit.unregister(_wait_all)
        atexit.register(_wait_all)
        self.context = context
        self.sender = Sender(sinks, context.say)
        self.offset = context.step_offset
        self.ending = False  # `ended` queued the end

    @classmethod
    def open(cls, report_to, context) -> "Trackers | None":
        """The trackers `report_to` names, open; None when none could be (each said)."""
        sinks = open_sinks(report_to, context)
        return cls(sinks, context) if sinks else None

    def judged(self, steps, findings) -> None:
        """Findings judged over the observed `steps` (diagkit's numbering; a steps table's
        column, with repeats): the series `diagkit/errors` and `diagkit/warnings` get one point
        per observed step."""
        values = tracked.counts(findings)
        self.sender.send("series", [(step + self.offset, dict(values))
                                    for step in sorted(set(map(int, steps)))])

    def announced(self, finding, step: int | None) -> None:
        """A new warning or error of a whole-run watch: the tracker's alert, once."""
        shown = None if step is None else step + self.offset
        self.sender.send("alert", *tracked.alert(finding, shown), shown)

    def ended(self, diagnosis, folder=None) -> None:
        """The end: the summary, the findings table and (with `folder`: report=True) the saved
        diagnosis as artifacts, then each sink closes. Returns at once: `wait` (a `stop()`,
        a framework's end of training, the process's exit) waits until it is sent."""
        self.sender.send("summary", tracked.status(diagnosis.findings))
        self.sender.send("table", tracked.findings_rows(diagnosis, self.offset))
        if folder is not None:
            self.sender.send("artifacts", folder)
        self.sender.end()
        self.ending = True
        _PENDING.add(self)

    def wait(self, timeout: float = WAIT_SECONDS) -> bool:
        """Wait until everything is sent (bounded): False if `timeout` passed first, said. A
        watch that failed before its end (`ended` never came) closes its sinks now."""
        if not self.ending:
            self.sender.end()
            self.ending = True
        sent = self.sender.wait(timeout)
        if not sent:
            self.context.say(f"diagkit: the trackers took over {timeout:.0f} s; what was not "
                             f"sent yet is left behind")
        _PENDING.discard(self)
        return sent


# Trackers whose last sends may still be under way: the process's exit waits for them.
_PENDING: "weakref.WeakSet[Trackers]" = weakref.WeakSet()


def _wait_all() -> None:
    """At the interpreter's exit, before the trackers' own exit hooks (registered when their
    runs were opened, earlier) close their runs: what diagkit queued is sent."""
    deadline = time.monotonic() + WAIT_SECONDS
    for trackers in list(_PENDING):
        trackers.wait(max(0.1, deadline - time.monotonic()))
