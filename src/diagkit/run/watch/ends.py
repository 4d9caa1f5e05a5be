"""However the user's run ends, a watch still going ends with it, and `out` is written with the
steps observed so far (docs/watch.md, "Diagnose your real training run").

Two paths cover every end but SIGKILL and `os._exit`:

- **the interpreter's exit** (`atexit`): the loop ended before `steps`, an exception or Ctrl-C
  left it, `sys.exit`. This callback runs after `threading` has shut down the thread pools
  (and on Python 3.12 no new thread may start), so saving must need no Python thread
  (`core.files.to_parquet`).
- **SIGTERM** (a scheduler pre-empting the job, `kill`, `timeout`) and **SIGHUP** (a terminal
  closed, an ssh session dropped): their default action ends the process without running
  `atexit`. While a watch is live this handler (one for both) ends the live watches
  (their `out` written; no report rendered: a pre-empted job has seconds, not a notebook run),
  then hands the signal on: to the handler the user had installed, else it ends the process as
  the signal would (killed by it: exit status 143 for SIGTERM in a shell). When the last watch
  ends, the user's handlers are back in place.

While either saves, a child's death (SIGCHLD) is only noted (`children.hold`): a job is ended
as a whole (Slurm's scancel, its time limit: SIGTERM to every process of the job), so the
DataLoader's workers die during the save. A child forked from the process (those workers) has
no watch of its own to save (`_forked`).

A failure while finishing is one line on stderr, never a traceback, and never changes how the
process ends.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import weakref

from . import children

_LIVE: list = []          # weak references to the watches not yet ended, oldest first
# The signals that end a process without `atexit` and that a watch saves on.
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
# The handlers ours replaced, by signal; whether it is saving the live watches now; a signal
# that came while a watch was saving below it, handed on once that one has saved; whether
# `_forked` is set.
_STATE = {"previous": {}, "saving": False, "pending": None, "forks": False}
_ENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # watch -> how it ends
OFF_MAIN_THREAD = ("diagkit: watch() was called outside the main thread, where Python cannot "
                   "catch SIGTERM or SIGHUP: a kill by either saves nothing (the interpreter's "
                   "exit still saves); call watch() in the main thread to have them caught")


def started(w, end) -> None:
    """`w` now observes: end it with the process if nothing else does first, by `end(w, how)`
    (the watch's own way of ending, said why: a function, so nothing here holds `w`)."""
    _LIVE.append(weakref.ref(w, _gone))
    _ENDS[w] = end
    atexit.unregister(_at_exit)  # registered again: runs before what was registered until now,
    atexit.register(_at_exit)    # as a callback registered by this watch itself would
    if any(signal.getsignal(s) is not _on_signal for s in SIGNALS):  # first, or the user's
        _install()
    if not _STATE["forks"] and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forked)
        _STATE["forks"] = True
    if threading.current_thread() is not threading.main_thread() and \
            not any(signal.getsignal(s) is _on_signal for s in SIGNALS):
        logging.getLogger("diagkit").warning(OFF_MAIN_THREAD)


def replace_earlier(w, model, optimizers) -> None:
    """A watch still on over the same optimizers (any in common, by identity), or over the
    same model's tensors where it has no optimizer or watches the whole run (which adopts any
    new optimizer of the model at its first step), is stopped, and one line says so: a
    notebook cell run again starts a second watch, and two watches would observe each step
    twice (docs/workbook.md, "The live view")."""
    mine = {id(o) for o in optimizers}
    tensors = {id(t) for t in model.parameters()}
    for ref in list(_LIVE):
        old = ref()
        if old is None or old is w or old.done:
            continue
        if mine & {id(o) for o in old.optimizers}:
            what = "optimizer"
        elif (not (optimizers and old.optimizers) or old.steps is None) and \
                tensors & {id(t) for t in getattr(old.inventory, "tensors", ())}:
            what = "model"
        else:
            continue
        observed = old.clock.observed if old.clock is not None else 0
        of = "" if old.steps is None else f" of {old.steps}"
        old.stop()
        report(f"diagkit: stopped the earlier watch on this {what} ({observed}{of} steps "
               f"observed; its diagnosis stays in it): this one replaces it")


def ended(w) -> None:
    """`w` has ended and saved (however it ended): forget it. The last one gives the signals
    back, or hands on one that came while it was saving."""
    _LIVE[:] = [r for r in _LIVE if r() is not None and r() is not w]
    if _LIVE or _STATE["saving"]:  # the signal handler hands it on itself
        return
    pending, _STATE["pending"] = _STATE["pending"], None
    if pending is None:
        _uninstall()
    else:
        _hand_on(*pending)


def _gone(ref) -> None:
    """A watch collected without ending (its optimizers were dropped first): forget it, and
    give the signals back once none is left. Collection can happen in any thread."""
    try:
        _LIVE.remove(ref)
        if not _LIVE and not _STATE["saving"] and _STATE["pending"] is None:
            _uninstall()
    except Exception:  # already forgotten, or this module torn down at the interpreter's end
        pass


def _forked() -> None:
    """In a child just forked (a DataLoader's worker, a `multiprocessing` process): the live
    watches are the parent's, and so is their `out`. The child inherits our handlers, and a
    terminal that closes sends SIGHUP to every process of the job: each worker saved its copy
    of the watch over the parent's `out`, as it was when that worker started. Here the child
    forgets them, so the signal, or its exit, is handed on as without diagkit."""
    _LIVE.clear()
    _STATE.update(saving=False, pending=None)
    children.forget()


def report(line: str) -> None:
    """One line on stderr, flushed (the process may be about to end)."""
    try:
        print(" ".join(part.strip() for part in line.splitlines() if part.strip()),
              file=sys.stderr, flush=True)
    except Exception:  # a closed stderr: nowhere left to say it
        pass


def end_live(how: str) -> None:
    """End every live watch, newest first; one line for each that cannot finish."""
    for ref in reversed(list(_LIVE)):
        w = ref()
        if w is None or w.done:
            continue
        try:
            end = _ENDS.get(w)
            if end is not None:
                end(w, how)  # the watch's own way of ending, said why
        except KeyboardInterrupt:  # Ctrl-C again while saving: the user wants out, now
            report(f"diagkit: interrupted while finishing the watch ({how})" + _lost(w))
            return
        except Exception as exc:  # never a traceback at exit: what went wrong, in one line
            report(f"diagkit: the watch could not finish ({how}): {type(exc).__name__}: "
                   f"{exc}" + _lost(w))


def _lost(w) -> str:
    return "" if w.out is None else f"; nothing was saved to {w.out}"


def _at_exit() -> None:
    ctrl_c = _ending_by_ctrl_c()
    children.hold()
    end_live("exit")
    children.release()  # one that came is not handed on: the process is ending
    _uninstall()
    if ctrl_c:
        _keep_ctrl_c_exit()


def _ending_by_ctrl_c() -> bool:
    """Whether a Ctrl-C (an uncaught KeyboardInterrupt) ended the main program: the interpreter
    then ends by SIGINT itself (exit status 130). A REPL or a notebook kernel, where an earlier
    interrupt leaves the same trace, does not."""
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    ipython = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)
    return (isinstance(last, KeyboardInterrupt) and not hasattr(sys, "ps1")
            and not sys.flags.interactive and ipython() is None)


def _keep_ctrl_c_exit() -> None:
    """CPython (until gh-128130 was fixed) forgets that the program died of Ctrl-C as soon
    as an atexit callback evaluates a string (namedtuple and dataclass creation do, in pandas
    and pyarrow): the exit status became 1. A string that raises KeyboardInterrupt, evaluated
    the same way, sets that record again."""
    try:
        exec("raise KeyboardInterrupt", {})  # noqa: S102 - a constant, for the record it sets
    except KeyboardInterrupt:
        pass


def _install() -> None:
    """Set the handler of each of `SIGNALS`, keeping the one it replaces. Not where the user's
    own choice stands in the way: the signal ignored (the process would not end), a handler
    set outside Python (it could not be put back), or a thread other than the main one
    (signals can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in SIGNALS:
        previous = signal.getsignal(signum)
        if previous is None or previous == signal.SIG_IGN or previous is _on_signal:
            continue
        signal.signal(signum, _on_signal)
        _STATE["previous"][signum] = previous


def _uninstall(signum=None):
    """Put the user's handlers back (unless they replaced ours meanwhile); returns the one of
    `signum`, which was ours to hand on."""
    previous, _STATE["previous"] = _STATE["previous"], {}
    for number, handler in previous.items():
        if signal.getsignal(number) is _on_signal:
            try:
                signal.signal(number, handler)
            except ValueError:  # ended in another thread: ours stays, and only passes it on
                _STATE["previous"][number] = handler
    return previous.get(signum)


def _on_signal(signum, frame) -> None:
    """Save, then let the signal do what it would have done. A watch already saving (this
    handler interrupted it) hands the signal on once it has saved; a second signal meanwhile
    (a launcher that signals the process and its group) does not cut a save short."""
    if _STATE["saving"] or _STATE["pending"] is not None:
        return
    _STATE["saving"] = True
    children.hold()  # until the signal is handed on
    try:
        end_live(signal.Signals(signum).name)
    finally:
        _STATE["saving"] = False
    if any(r() is not None for r in _LIVE):  # still saving, below this handler
        _STATE["pending"] = (signum, frame)
        return
    _hand_on(signum, frame)


def _hand_on(signum, frame) -> None:
    """The signal as it would have been without diagkit: the user's handler, else the end of
    the process by the signal itself (flushed first: the lines said so far are kept). From
    another thread (a watch that saved there), the signal goes again to the main thread's
    handler."""
    if threading.current_thread() is not threading.main_thread():
        os.kill(os.getpid(), signum)
        return
    previous = _uninstall(signum)
    if callable(previous):
        came = children.release()
        previous(signum, frame)
        if came:  # the process goes on: the child's death is told now, as it was held
            signal.raise_signal(children.SIGCHLD)
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # SIGCHLD stays held: nothing of the process runs on
