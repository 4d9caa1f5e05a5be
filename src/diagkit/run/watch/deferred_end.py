"""An end asked while a whole-run watch is inside its own work waits until that work is done
(issue 36, R19): its `on_finding` callback calling `stop()`, or a signal that interrupted a
window's judging, ended the watch there, which judged and released the run under the window
it was closing."""

from __future__ import annotations


class DeferredEnd:
    """`busily` runs the whole run's own work (its plan, its `on_finding`); `held` says whether
    an end asked now waits, and keeps how the first one was asked (`asked`)."""

    def __init__(self):
        self.depth = 0                  # how deep inside the whole run's own work
        self.asked: str | None = None   # how the end asked meanwhile was asked (meta["ended"])

    def busily(self, work, *args):
        """`work(*args)` with the whole run busy: its plan, and its `on_finding` (called also
        where no plan is under it: an optimizer adopted in its first step)."""
        self.depth += 1
        try:
            return work(*args)
        finally:
            self.depth -= 1

    def held(self, how: str) -> bool:
        """Whether an end asked now (`how`: "stop", "exit", "SIGTERM") waits for the work in
        progress; the first one asked is kept for when it is done."""
        if not self.depth:
            return False
        self.asked = self.asked or how
        return True
