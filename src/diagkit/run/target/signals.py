"""SIGINT and SIGTERM on the command line: one line, exit 130 / 143, and no file left behind.

Ctrl-C already raises `KeyboardInterrupt`; SIGTERM (`kill`, a CI job cancelled, a batch
scheduler's time limit) would end the process at once, skipping every `finally`: scratch folders
and temporary files beside the outputs stayed, and the notebook kernel's connection file in
$TMPDIR. Here SIGTERM raises `Terminated`, a `KeyboardInterrupt`, so every cleanup that already
handles an interrupt (atomic writes, the report's scratch folder, papermill's kernel shutdown,
restoring the model) runs for it too.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells report


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM: raised where the main thread is, like Ctrl-C's interrupt."""

    signum = signal.SIGTERM


def _raise(signum, _frame):
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def handled():
    """SIGTERM raises `Terminated` for the duration (signals can only be set in the main
    thread: elsewhere, as in a test calling `main` from a thread, nothing changes)."""
    if not _main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_code(exc: KeyboardInterrupt) -> tuple[int, str]:
    """The exit code and the one line for an interrupt that ended the command."""
    if isinstance(exc, Terminated):
        return EXIT_CODES[signal.SIGTERM], "terminated (SIGTERM); no output was left half-written"
    return EXIT_CODES[signal.SIGINT], "interrupted (SIGINT); no output was left half-written"


def ignore_more() -> None:
    """After the first signal, a second one (an impatient Ctrl-C) must not turn the one line
    into a traceback while the command ends; nor may asyncio's report of a task left with an
    exception: a report interrupted while the kernel died leaves papermill's cell task with a
    `DeadKernelError` that asyncio logs with its traceback when the task is collected, after
    the one line (seen once in CI, depending on which of the two went first)."""
    logging.getLogger("asyncio").disabled = True
    if _main_thread():
        for signum in EXIT_CODES:
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def deferred():
    """Hold SIGINT / SIGTERM while a few renames swap complete outputs into place: the old
    files or the new ones, never a mix. A signal that came meanwhile is raised afterwards."""
    if not _main_thread():
        yield
        return
    got = []
    previous = {s: signal.signal(s, lambda signum, _frame: got.append(signum))
                for s in EXIT_CODES}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if got:
        _raise(got[0], None)
