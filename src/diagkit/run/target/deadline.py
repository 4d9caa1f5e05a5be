"""`--timeout` for a run in this process (a run under `--nproc` is bounded by the launcher).

A target that hangs (a `batch_fn` waiting on a queue nobody fills, a dead data server) would hang
`check` and `report` forever. The command line bounds each run: `bound_runs(seconds)` sets the
bound in `$DIAGKIT_RUN_TIMEOUT`, so a notebook kernel that `diagkit report` starts inherits it;
the clock starts when a target begins to import (`mark("importing")` in `load_target`) and
stops when its steps are done (`finish`). The loop says where it is (`mark(phase, step)`), so
the one line at expiry names the step and the phase. The import the command line makes first,
to check a target before it runs it, launches ranks or starts a kernel, is bounded on its own
clock by the same `--timeout` (`bound_import`), and so is `compare`'s work (`bound`).

At expiry a watchdog thread sends SIGALRM to the main thread, whose handler raises `TimedOut`
there: a Python-level wait in the user's code (sleep, a lock, a queue, a socket) is woken, the
step is recorded as failed, and the steps before it are kept and judged as usual (the outputs
are written complete, by the normal code). A thread cannot be killed in Python: if the main
thread does not come back within `GRACE_S` (stuck in C code, or the user's code swallowed the
exception), the watchdog prints the line, lets the command write what was completed
(`on_hard_expiry`: the CLI writes `--json` from the completed steps, atomically), flushes, and
ends the process with `os._exit(2)`. In a notebook kernel the kernel then dies, and the report
says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from ...core.errors import DiagkitError, TargetError
from ...core.options import check_option

ENV = "DIAGKIT_RUN_TIMEOUT"
GRACE_S = 10.0  # how long the main thread may take to come back before the process is ended
PREFIX = "timed out after"  # how a timeout's StepFailure starts (`is_timeout`)
_hard_expiry = None  # the command's writer of completed work (see `bound_runs`)
_active: Deadline | None = None  # the run being timed in this process


class TimedOut(BaseException):
    """Raised in the main thread at expiry. A BaseException: a user's `except Exception`
    around a step must not swallow it."""


# What a phase outside the steps is doing, for the line at expiry.
_DOING = {"importing": "importing the target", "building": "building the setup",
          "comparing": "comparing the checkpoints"}


class Deadline:
    """One run's clock: where the run is, and a watchdog thread that ends it at expiry."""

    def __init__(self, seconds: float):
        self.seconds, self.phase, self.step = seconds, "building", None
        self.expired = self.finished = False
        self.snapshot = None  # `observe` sets it: the completed steps, for `on_hard_expiry`
        self._done = threading.Event()
        self._main = threading.main_thread().ident
        self._soft = _in_main()  # signal handlers can only be set from the main thread
        self._previous = signal.signal(signal.SIGALRM, self._raise) if self._soft else None
        threading.Thread(target=self._watch, name="diagkit-timeout", daemon=True).start()

    def message(self) -> str:
        where = (f"in step {self.step}, {self.phase}" if self.step is not None
                 else f"while {_DOING.get(self.phase, 'building the setup')}")
        return f"{PREFIX} {self.seconds:g} s (--timeout) {where}"

    def _raise(self, _signum, _frame):
        if not self.finished:
            raise TimedOut(self.message())

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.expired = True
        if self._soft:
            signal.pthread_kill(self._main, signal.SIGALRM)
        if not self._done.wait(GRACE_S):
            _end_process(self)

    def finish(self) -> None:
        """The steps are done (or the run failed): stop the clock, put SIGALRM back."""
        self.finished = True
        self._done.set()
        if self._soft and _in_main():
            signal.signal(signal.SIGALRM, self._previous or signal.SIG_DFL)
            self._soft = False


def _in_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def _end_process(deadline: Deadline) -> None:
    """The main thread is stuck for good: say why, keep what was completed, end the process."""
    print(f"diagkit: error: {deadline.message()}; the run did not stop, so diagkit ended it",
          file=sys.stderr)
    if _hard_expiry is not None and deadline.snapshot is not None:
        with contextlib.suppress(BaseException):
            _hard_expiry(deadline.snapshot())
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(2)


@contextlib.contextmanager
def bound_runs(seconds, on_hard_expiry=None):
    """Bound every run this process (or a kernel it starts) makes meanwhile by `seconds`.
    `on_hard_expiry(observation)` writes the completed steps if the process must be ended."""
    global _hard_expiry
    check_option("timeout", seconds, "--timeout")
    before = os.environ.get(ENV)
    os.environ[ENV], _hard_expiry = str(seconds), on_hard_expiry
    try:
        yield
    finally:
        _hard_expiry = None
        finish()
        os.environ.pop(ENV) if before is None else os.environ.__setitem__(ENV, before)


def bound_import(seconds):
    """Bound by `seconds` (None: no bound) the import of a target that the command line
    makes to check it before it runs: a module that hangs at import (a lock, a server that
    never answers) would otherwise hang `diagkit` before any run's clock starts. Its expiry is
    one line (a TargetError naming the phase), as for a run."""
    return bound(seconds, "importing", error=TargetError)


@contextlib.contextmanager
def bound(seconds, phase: str, error=DiagkitError):
    """Bound by `seconds` (None: no bound) one piece of work the command line does itself,
    outside a run (`phase`: a key of `_DOING`): `bound_import`, and `compare`, whose reads of
    a checkpoint on a stalled network mount would otherwise never end. Its expiry is one line
    naming the phase, an `error` (exit 2), as for a run's."""
    if seconds is None:
        yield
        return
    clock = Deadline(float(check_option("timeout", seconds, "--timeout")))
    clock.phase = phase
    try:
        yield
    except TimedOut as exc:  # woken after the work's own handlers (or between them)
        raise error(str(exc)) from None
    finally:
        clock.finish()


_STARTS = ("importing", "building")  # the first marks of a run (`target.load_target`)


def mark(phase: str, step: int | None = None) -> None:
    """Where the run is now. The first mark of a run under a bound starts its clock."""
    global _active
    if _active is None or _active.finished:
        seconds = os.environ.get(ENV)
        if not seconds or phase not in _STARTS:
            return
        _active = Deadline(float(seconds))
    _active.phase, _active.step = phase, step


def active() -> Deadline | None:
    return _active if _active is not None and not _active.finished else None


def finish() -> None:
    """The run's steps are done, or it failed: no timeout from now on."""
    if _active is not None:
        _active.finish()


def is_timeout(failure) -> bool:
    return failure is not None and str(failure.error).startswith(PREFIX)
