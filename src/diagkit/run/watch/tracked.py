"""A watch's trackers (`report_to`): opened as the watch starts (rank 0 only), fed by the whole
run's windows and by the end (docs/integrations.md, "Trackers"). Nothing here raises into the
user's loop: a tracker that cannot be opened is one line, and the watch goes on."""

from __future__ import annotations

import logging


def opened(report_to, context, out):
    """The watch's `Trackers`, or None (nothing named, or nothing could be opened: each said).
    `context`: a framework's `trackers.context.Context` (its step numbering, its objects, its
    `report_to`); standalone, the watch's own."""
    if report_to is None and (context is None or not context.objects.get("report_to")):
        return None
    chosen = report_to if report_to is not None else context.objects.get("report_to")
    try:  # imported only here: a watch without report_to loads none of it
        from ..trackers.context import Context
        from ..trackers.watching import Trackers
        return Trackers.open(chosen, context or Context(out=out))
    except Exception as exc:  # diagkit's own failure: one line, the watch goes on
        logging.getLogger("diagkit").warning(
            "diagkit: could not open the trackers: %s: %s (the watch goes on)",
            type(exc).__name__, exc)
        return None


def ended(trackers, diagnosis, *, whole_run: bool, folder) -> None:
    """The watch's end: a watch of `steps` steps sends its series now (it was judged once, at
    the end; a whole run sent each window's), then the summary, the table and the artifacts.
    Returns at once: `Watch.stop()` (and the process's exit) waits until they are sent."""
    if trackers is None or diagnosis is None:
        return
    try:
        if not whole_run and len(diagnosis.steps):
            trackers.judged(diagnosis.steps["step"], diagnosis.findings)
        trackers.ended(diagnosis, folder)
    except Exception as exc:
        logging.getLogger("diagkit").warning(
            "diagkit: could not send to the trackers: %s: %s", type(exc).__name__, exc)
