"""A child's death (SIGCHLD) held while a watch saves at the process's end (`ends`): noted, not
handled, from `hold()` until `release()` (docs/watch.md, "Diagnose your real training run")."""

from __future__ import annotations

import signal
import threading

SIGCHLD = getattr(signal, "SIGCHLD", None)  # none on Windows
# While SIGCHLD is held: the handler it replaced, and whether one came.
_HELD = {"replaced": None, "came": False}


def hold() -> None:
    """From now until `release`, SIGCHLD is only noted. A job's processes are ended together
    (Slurm's scancel, its time limit or a pre-emption signal the whole process group), so the
    DataLoader's workers die while the watch saves; the SIGCHLD handler that torch's
    DataLoader sets raises its RuntimeError ("DataLoader worker (pid N) is killed by signal:
    Terminated.") in the main thread, that is inside the save, and nothing was saved.

    The handler is swapped for one that notes the signal rather than the signal blocked:
    `pthread_sigmask` blocks it in the calling thread only, the kernel hands a process's
    SIGCHLD to any thread that does not block it (torch's and pyarrow's pools started before),
    and Python then runs the handler in the main thread all the same. Nor is it set to SIG_DFL:
    a SIGCHLD that came meanwhile is handed on (`ends._hand_on`) when the process goes on after
    the signal (the user's own handler returned), as without diagkit. A worker that died just
    before the swap runs the old handler as it is swapped (`signal.signal` runs the pending
    ones first): its error is taken as that SIGCHLD noted, and the swap tried again. A
    handler set outside Python (`getsignal` gives None) could not be put back: left alone."""
    if SIGCHLD is None or _HELD["replaced"] is not None or \
            threading.current_thread() is not threading.main_thread():
        return
    _HELD["came"] = False
    replaced = None
    for _attempt in range(8):  # one more per child that died during the last try
        try:
            current = signal.getsignal(SIGCHLD)
            if current is not _noted:
                if current is None:
                    return
                replaced = current
                signal.signal(SIGCHLD, _noted)
            _HELD["replaced"] = replaced
            return
        except (ValueError, OSError):  # no signal may be set now: nothing held
            return
        except Exception:  # noqa: BLE001  the old handler ran and raised: a child died
            _HELD["came"] = True


def _noted(_signum, _frame) -> None:
    _HELD["came"] = True


def release() -> bool:
    """Put the SIGCHLD handler back (unless it was replaced meanwhile); whether a SIGCHLD came
    while it was held."""
    replaced, _HELD["replaced"] = _HELD["replaced"], None
    if replaced is None:
        return False
    try:
        if signal.getsignal(SIGCHLD) is _noted:
            signal.signal(SIGCHLD, replaced)
    except Exception:  # noqa: BLE001  a child's handler that raised as it was put back: told
        return True
    return _HELD["came"]


def forget() -> None:
    """In a child just forked (`ends._forked`): the handler held is the parent's to put back."""
    _HELD["replaced"] = None
