"""Sending to the trackers from a thread of its own: nothing a tracker does (a network call, a
file write, a failure) happens on the training loop's thread (benchmarks/README.md, "Trackers").
"""

from __future__ import annotations

import queue
import threading

from ...core.format import brief

_STOP = object()


class Sender:
    """`send(method, *args)` queues a call of `method` on every sink; one daemon thread makes
    them in order. A sink that raises is said once ("could not send to ...") and dropped; the
    sender never raises. `flush(timeout)` waits until what was queued is sent (the watch's end,
    before a framework closes its trackers)."""

    def __init__(self, sinks: list, say):
        self.sinks, self.say = list(sinks), say
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="diagkit-trackers", daemon=True)
        self._thread.start()

    def send(self, method: str, *args) -> None:
        """Queue `method(*args)` for every sink (returns at once)."""
        if self.sinks:
            self._queue.put((method, args))

    def flush(self, timeout: float = 30.0) -> bool:
        """Send what is queued and make it durable (each sink's `flush`); False if `timeout`
        seconds passed first (the rest is still sent, later, if the process lives)."""
        done = threading.Event()
        self._queue.put(("flush", (done,)))
        return done.wait(timeout)

    def end(self) -> None:
        """After what is queued: flush, close each sink, end the thread. Returns at once (a
        watch that ends inside a training step does not wait for its trackers)."""
        self._queue.put(("flush", (threading.Event(),)))
        self._queue.put(("close", ()))
        self._queue.put((_STOP, ()))

    def wait(self, timeout: float = 30.0) -> bool:
        """Wait until the thread has sent everything and ended (`end`); False if `timeout`
        seconds passed first."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self, timeout: float = 30.0) -> bool:
        """`end`, then `wait`."""
        self.end()
        return self.wait(timeout)

    def _drain(self) -> None:
        while True:
            method, args = self._queue.get()
            if method is _STOP:
                return
            if method == "flush":
                self._each("flush")
                args[0].set()
                continue
            self._each(method, *args)

    def _each(self, method: str, *args) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # the tracker's failure: said once, never the run's
                self.sinks.remove(sink)
                try:
                    self.say(f"diagkit: could not send to {sink.name}: {type(exc).__name__}: "
                             f"{brief(exc, 300)} (the run goes on; diagkit stops sending to it)")
                except Exception:
                    pass
