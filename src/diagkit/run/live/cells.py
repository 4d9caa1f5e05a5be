"""When the loop leaves the cell (docs/workbook.md, "The live view"): the live view follows
IPython's `pre_run_cell` and `post_run_cell` events, for two things.

- **The explorer is built when the cell ends.** A watch of `steps` steps usually ends while
  its loop goes on in the same cell; building the explorer then (a few hundred ms of widgets
  on the feed's thread, which holds the GIL) slowed the loop's next steps by ~10 %. So the
  panel shows the end at once, and the explorer is built in `post_run_cell`, after the loop;
  `LiveFeed.join()` builds it at once (the caller waits for it). A watch that ends while no
  cell runs (a loop in a thread of its own) builds it on the feed's thread.
- **A cell that ends with the watch still on says what ends it**: `w.stop()` gives the
  explorer and the final save (a whole run; or a watch of `steps` steps the loop left early).
"""

from __future__ import annotations

import threading


class Cells:
    """The cells as one `LiveFeed` sees them: whether one is running, the note the status
    line carries, and the one build of the explorer."""

    def __init__(self, feed):
        self.feed = feed
        # Made in a cell (the main thread), as a watch in a notebook is.
        self.running = threading.current_thread() is threading.main_thread()
        self._left = False             # a cell ended with the watch still on
        self._name: str | None = None  # the user's name for the watch (`w`)
        self._pending = None           # (diagnosis,) once the watch ended
        self._done = False             # the explorer was shown (or why not)
        self._lock = threading.Lock()
        from IPython import get_ipython
        shell = get_ipython()
        self._events = getattr(shell, "events", None)
        self._ns = getattr(shell, "user_ns", None) or {}
        if self._events is not None:
            self._events.register("pre_run_cell", self._pre)
            self._events.register("post_run_cell", self._post)

    # ------------------------------------------------------------ what the status says
    def note(self) -> str:
        """While the watch is on: after a cell ended, what ends it."""
        if not self._left:
            return ""
        w = self.feed.watch
        stop = f"`{self._name}.stop()`" if self._name else "`stop()` on the watch"
        save = f" and the final save to {w.out}" if w.out is not None else ""
        if w.steps is None:
            return f"the cell ended; the watch goes on with the run: {stop} ends it, with the " \
                   f"explorer here{save}"
        return f"the cell ended; the watch goes on with the loop's next steps: {stop} ends " \
               f"it now, with the explorer here{save}"

    def ended_note(self) -> str:
        """Once the watch ended: when the explorer comes."""
        return "ended: the explorer opens here when this cell ends" if self.running else \
            "ended"

    # ------------------------------------------------------------ the explorer, once
    def ended(self, diagnosis) -> None:
        """The watch ended (the feed's thread): the explorer now if no cell is running."""
        self._pending = (diagnosis,)
        if not self.running:
            self.show_explorer()

    def show_explorer(self) -> None:
        """Build the explorer (once, on the calling thread) if the watch ended."""
        with self._lock:
            if self._done or self._pending is None:
                return
            self._done = True
        try:
            self.feed.show_explorer(self._pending[0])
        finally:
            self._unregister()

    def _unregister(self) -> None:
        if self._events is None:
            return
        for event, callback in (("pre_run_cell", self._pre), ("post_run_cell", self._post)):
            try:
                self._events.unregister(event, callback)
            except ValueError:  # already gone
                pass
        self._events = None

    # ------------------------------------------------------------ IPython's events
    def _pre(self, _info=None) -> None:
        self.running, self._left = True, False

    def _post(self, _result=None) -> None:
        """A cell ended: the explorer if the watch ended, else the note on what ends it."""
        self.running = False
        try:
            if self.feed.ending:
                self.feed.wait_shown(10)  # its last view shown first
                self.show_explorer()
                return
            if self.feed.watch.done:
                return
            self._left = True
            self._name = next((k for k, v in list(self._ns.items())
                               if v is self.feed.watch and not k.startswith("_")), None)
            self.feed.refresh()
        except Exception:  # never into the user's notebook: the panel simply says less
            pass
