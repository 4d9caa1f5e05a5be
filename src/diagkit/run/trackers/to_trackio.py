"""Trackio: diagkit's status, findings and alerts in the Trackio run already open
(docs/integrations.md, "Trackers"). diagkit never calls `trackio.init`: it sends to the run the
user (or HF's `TrackioCallback`) opened, or to the `trackio.Run` given in `report_to`. Locally it
all lands in the project's SQLite file under `TRACKIO_DIR`; a run logging to a Space sends it
there, as trackio does with the run's own metrics.

Steps: a row logged with `step=s` moves the run's counter (the step of the next row logged
without one) on to `s + 1`. A caller that logs without steps (HF's `TrackioCallback`) would see
its later rows skip steps. So a point is logged at its training step, but never past the last
step the run has used: a run whose rows carry their steps gets diagkit's beside them; one
numbered by the counter gets them at its latest row, and its own numbering is left as it was.
Each row also carries `diagkit/step`, the training step itself."""

from __future__ import annotations

import sys
from pathlib import Path

from ...present import tracked
from .sink import Sink

STEP = "diagkit/step"  # the training step of a row (its Trackio step may be an earlier one)
ARTIFACT = "diagkit-diagnosis"  # one artifact name per project: each run logs a version of it


def owns(obj) -> bool:
    """A Trackio run (`trackio.init(...)`'s result)."""
    trackio = sys.modules.get("trackio")
    return trackio is not None and isinstance(obj, trackio.Run)


def active() -> bool:
    """A Trackio run is open in this thread's context (trackio is never imported for it)."""
    return _current() is not None


def open(context, given=None) -> "TrackioSink | None":
    """A sink on `given` or on the current run; None and one line when no run is open. The run
    is taken here, on the caller's thread: trackio keeps its current run in a context variable,
    which the sender's thread does not see."""
    run = given if given is not None else _current()
    if run is None:
        context.say("diagkit: report_to 'trackio': no Trackio run is open (trackio.init() "
                    "first, or let the framework's Trackio callback open it); not sending to it")
        return None
    return TrackioSink(run)


class TrackioSink(Sink):
    """Sends to one Trackio run. Trackio has no summary: the final status is one more log row at
    the last step sent (the dashboard shows a metric's last value)."""

    name = "trackio"

    def __init__(self, run):
        self.run = run
        self.last_step: int | None = None

    def scalars(self, values: dict[str, float], step: int) -> None:
        """The counts, with `diagkit/step` the training step, at that step or the run's last
        one used, whichever comes first (the module's docstring)."""
        self._check()
        at = self._within(step)
        self.run.log({**values, STEP: step}, step=at)
        self.last_step = at if self.last_step is None else max(self.last_step, at)

    def summary(self, values: dict) -> None:
        """`diagkit/errors`, `diagkit/warnings` and `diagkit/status` (the word) in one row."""
        self._check()
        self.run.log(dict(values), step=self.last_step)

    def table(self, rows: list[list]) -> None:
        """A `trackio.Table` under `diagkit/findings`."""
        import trackio
        self._check()
        self.run.log({tracked.TABLE_KEY: trackio.Table(columns=list(tracked.TABLE_COLUMNS),
                                                       data=rows)}, step=self.last_step)

    def alert(self, title: str, text: str, level: str, step: int | None = None) -> None:
        """`trackio.alert` on the run: printed, stored with the run, sent to its webhook."""
        import trackio
        self._check()
        levels = trackio.AlertLevel
        self.run.alert(title=title, text=text,
                       level=levels.ERROR if level == "error" else levels.WARN, step=step)

    def artifacts(self, folder: Path) -> None:
        """The saved diagnosis folder as a version of artifact `diagkit-diagnosis`, type
        `diagkit`."""
        self._check()
        self.run.log_artifact(Path(folder), name=ARTIFACT, type="diagkit")

    def _within(self, step: int) -> int:
        """`step`, or the last step the run used if that comes first. Trackio has no public
        counter: `_next_step` is what its `log` keeps; without it, `step` as it is."""
        following = getattr(self.run, "_next_step", None)
        if not isinstance(following, int):
            return step
        return max(0, min(step, following - 1))

    def _check(self) -> None:
        """A finished run still takes writes in trackio (silently): say it instead, once (the
        sender drops the sink). Trackio has no public flag for it; `_stop_flag` is what its
        `finish` sets."""
        stop = getattr(self.run, "_stop_flag", None)
        if stop is not None and stop.is_set():
            raise RuntimeError(f"the Trackio run {self.run.name!r} is finished")


def _current():
    trackio = sys.modules.get("trackio")
    return None if trackio is None else trackio.context_vars.current_run.get()
