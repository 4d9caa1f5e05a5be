"""The sender (`run.trackers.sender`): every call on a thread of its own, in order; a sink that
raises is one line and dropped, the others get everything; `flush` waits; it never raises."""

from __future__ import annotations

import threading
import time

from diagkit.run.trackers.sender import Sender
from diagkit.run.trackers.sink import Sink


class Recording(Sink):
    """Each call (method, args) and the thread it came on."""

    def __init__(self, name="recording", gate: threading.Event | None = None):
        self.name, self.gate = name, gate
        self.calls: list[tuple] = []
        self.threads: set[int] = set()

    def _record(self, method, *args):
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append((method, *args))
        self.threads.add(threading.get_ident())

    def scalars(self, values, step):
        self._record("scalars", values, step)

    def summary(self, values):
        self._record("summary", values)

    def alert(self, title, text, level, step=None):
        self._record("alert", title, text, level)

    def flush(self):
        self._record("flush")

    def close(self):
        self._record("close")


class Failing(Recording):
    """Raises on its `failing` call, as a tracker whose run went away does."""

    def __init__(self, failing="scalars"):
        super().__init__("broken")
        self.failing = failing

    def scalars(self, values, step):
        if self.failing == "scalars" and step == 1:
            raise ConnectionError("the tracker's server went away\n(second line)")
        super().scalars(values, step)


def test_calls_run_in_order_on_a_thread_other_than_the_callers():
    sink, lines = Recording(), []
    sender = Sender([sink], lines.append)
    for step in range(3):
        sender.send("scalars", {"diagkit/errors": 1.0}, step)
    sender.send("summary", {"diagkit/status": "error"})
    assert sender.flush(5)
    assert sink.calls == [("scalars", {"diagkit/errors": 1.0}, 0),
                          ("scalars", {"diagkit/errors": 1.0}, 1),
                          ("scalars", {"diagkit/errors": 1.0}, 2),
                          ("summary", {"diagkit/status": "error"}), ("flush",)]
    assert sink.threads == {sender._thread.ident} != {threading.get_ident()}
    assert sender.close(5) and sink.calls[-2:] == [("flush",), ("close",)]
    assert not sender._thread.is_alive() and lines == []


def test_a_sink_that_raises_is_one_line_and_dropped_and_the_others_get_everything():
    broken, kept, lines = Failing(), Recording(), []
    sender = Sender([broken, kept], lines.append)
    for step in range(3):
        sender.send("scalars", {"diagkit/errors": 0.0}, step)
    sender.send("alert", "diagkit: orphan", "diagkit: error: orphan in fc2", "error")
    assert sender.close(5)
    assert lines == ["diagkit: could not send to broken: ConnectionError: the tracker's server "
                     "went away (second line) (the run goes on; diagkit stops sending to it)"]
    assert [c[0] for c in broken.calls] == ["scalars"]  # step 0 only: then dropped
    assert [c[0] for c in kept.calls] == ["scalars"] * 3 + ["alert", "flush", "close"]
    assert sender.sinks == [kept]


def test_send_returns_at_once_and_flush_waits_until_a_slow_sink_is_done():
    gate = threading.Event()
    slow = Recording(gate=gate)
    sender = Sender([slow], [].append)
    start = time.perf_counter()
    for step in range(100):
        sender.send("scalars", {"diagkit/errors": 0.0}, step)
    assert time.perf_counter() - start < 0.5  # the loop's thread never waits for a tracker
    assert sender.flush(0.2) is False  # the sink is still held: flush says it did not finish
    assert slow.calls == []
    gate.set()
    assert sender.flush(5) is True
    assert [c[2] for c in slow.calls if c[0] == "scalars"] == list(range(100))
    assert sender.close(5)


def test_it_never_raises_even_when_saying_fails():
    def say(line):
        raise RuntimeError("the logger is gone")

    sender = Sender([Failing()], say)
    sender.send("scalars", {}, 1)
    assert sender.flush(5)  # the thread lived through both failures
    assert sender.sinks == []
    sender.send("scalars", {}, 2)  # nothing left to send to: nothing queued
    assert sender._queue.empty()
    assert sender.close(5)


def test_a_sink_without_a_method_is_dropped_like_one_that_raises():
    class Partial:  # a tracker object that is not a Sink: no `summary`
        name = "partial"

    lines = []
    sender = Sender([Partial()], lines.append)
    sender.send("summary", {"diagkit/status": "ok"})
    assert sender.close(5)
    assert lines[0].startswith("diagkit: could not send to partial: AttributeError:")


def test_a_wait_with_no_end_queued_closes_the_sinks_at_once():
    """A watch that failed before its end never queued it: the user's `stop()` still waits
    only as long as the sending takes (it closed the sinks), not the 30 s bound."""
    from diagkit.run.trackers.context import Context
    from diagkit.run.trackers.watching import Trackers
    sink = Recording()
    trackers = Trackers([sink], Context(say=lambda line: None))
    trackers.judged([0], [])
    start = time.monotonic()
    assert trackers.wait(5)
    assert time.monotonic() - start < 2
    assert [c[0] for c in sink.calls] == ["scalars", "flush", "close"]
