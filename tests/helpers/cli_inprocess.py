"""`run_cli`: the `diagkit` command line run in this process, for tests that only check what it
prints, what it writes and its exit code (docs/development.md, "Tests").

A test that runs the console script in a subprocess pays for a fresh interpreter importing
torch, pandas and diagkit (about 1.5 s of CPU each time, more on a loaded machine) before the
command does anything. `run_cli("check", "diagkit.demos:clean", "--json", "o.json")` calls the
console script's own entry point, `diagkit.run.cli.commands.main(argv)`, and returns what
`subprocess.run([diagkit, ...], capture_output=True, text=True)` would: a
`subprocess.CompletedProcess` with `returncode`, `stdout` and `stderr` (as text, newlines
translated as `text=True` does).

What it does as a process would:

- **Output.** File descriptors 1 and 2 are pointed at files of their own for the call, and
  `sys.stdout` / `sys.stderr` are fresh text streams on them (the encoding of this
  interpreter's own stdio, `backslashreplace` on stderr, as Python sets them up), so `print`,
  `logging`'s last-resort handler (warnings and errors: the root logger's handlers, such as
  pytest's log capture, are taken off for the call), `warnings` (shown once per place under the
  interpreter's default filters, not recorded by pytest), C code and any process the command
  starts (a notebook's kernel) all land in `stdout` / `stderr`. The CLI may reconfigure those
  streams (`cli_run.safe_console`): they are its own, and dropped afterwards.
- **`timeout`** (600 s unless given): a safety net, as `subprocess.run`'s: a call still
  running then is interrupted as Ctrl-C would (the CLI's cleanups run) and
  `subprocess.TimeoutExpired` is raised.
- **Exit code.** `main`'s return value; a `SystemExit` (`--help`) gives its code as the
  interpreter would (None: 0, a message: printed, 1); an exception that escapes `main` (under
  `DIAGKIT_DEBUG=1`) is printed as a traceback on stderr, exit 1.
- **The process's state is put back**, so that many calls in one pytest worker do not see each
  other: the working folder (`cwd`), the environment (`env`: variables to set for the call,
  None to unset one), `sys.argv`, `sys.path`, every signal handler (the CLI sets SIGTERM's, a
  `--timeout` SIGALRM's, an interrupt sets SIG_IGN), the loggers (handlers, levels, `disabled`:
  an interrupt disables asyncio's), the warning filters, and the modules the call imported
  from outside the repository and the virtual environment: a file target
  (`diagkit_target_*`) and the sibling modules it imported (`import helpers` next to
  `t.py`), so that the next test's `helpers.py` in another folder is imported afresh, as in a
  new process; such modules another test left in `sys.modules` are hidden during the call.

What differs from a real process, so which tests must stay a subprocess:

- **Nothing is imported fresh.** Modules stay imported between calls, with their state:
  caches, `diagkit.run.target.deadline`'s last clock, torch's settings and RNG, what a target module
  imported from site-packages, warnings a module gives only when first imported. A dotted
  target is imported once per worker (`diagkit.demos:*` and the tests' own modules are fine:
  they never change); a dotted target a test writes into its own folder is not for `run_cli`.
  `sys.path` is pytest's: it holds tests/helpers/ and the folder `python -m pytest` started
  in, which the console script's does not, so a module target found only there
  (`fix_targets:orphan`) is found here and not by the console script.
- **The console script itself** (its installed entry point, `python -m diagkit`, a wheel):
  only a subprocess runs it.
- **Ending by a signal** (SIGINT / SIGTERM sent to the command, exit 130 / 143): a signal
  sent here would hit pytest. **A timeout that ends the process** (`deadline`'s `os._exit(2)`
  when the main thread never comes back) would end the pytest worker. A `--timeout` whose
  main thread does come back (a hung batch, a build that sleeps) is fine here; it needs the
  main thread, so `run_cli` refuses to run in any other. One that expired while a call first
  imports torch's pieces would leave them half imported in the worker, so before its first
  call with `--timeout` a worker runs one whole check (`_warm_up`).
- **`--nproc N`** (torchrun jobs): they start their own processes anyway, and the tests keep
  them whole; run them as a subprocess.
- **The interpreter's set-up from the environment**: `PYTHONIOENCODING`, `PYTHONWARNINGS`,
  `PYTHONPATH`, a locale (`LANG`, `LC_ALL`) set in `env` reach the command's `os.environ` but
  not this interpreter's streams or `sys.path`.
- **stdin** is this process's; `atexit` callbacks run when the worker exits, not after the
  call; a Ctrl-C of pytest during a call is the command's interrupt (exit 130), not pytest's.

Each module that uses `run_cli` keeps at least one test of the real console script in a
subprocess.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import locale
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIAGKIT = str(Path(sys.executable).parent / "diagkit")  # the console script, for sys.argv[0]
TIMEOUT = 600  # seconds: run_cli's safety net against a call that never ends
# The warning filters of an interpreter started without -W or PYTHONWARNINGS (in order).
_DEFAULT_FILTERS = (("default", DeprecationWarning, "__main__"),
                    ("ignore", DeprecationWarning, ""),
                    ("ignore", PendingDeprecationWarning, ""),
                    ("ignore", ImportWarning, ""),
                    ("ignore", ResourceWarning, ""))


def run_cli(*args, cwd=None, env=None, timeout=TIMEOUT) -> subprocess.CompletedProcess:
    """`diagkit ARGS...` in this process: exit code, stdout and stderr as a subprocess's (see
    the module's docstring for what is and is not as in a real process). `cwd`: the working
    folder for the call; `env`: environment variables to set for the call (None: unset).
    `timeout`: a safety net, as `subprocess.run`'s: a call still running after it is
    interrupted as Ctrl-C would (its cleanups run), then `subprocess.TimeoutExpired` is
    raised."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_cli needs the main thread (the CLI's signal handlers and "
                           "--timeout work only there)")
    argv = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    from diagkit.run.cli.commands import main
    if any(a == "--timeout" or a.startswith("--timeout=") for a in argv):
        _warm_up(main)
    with _process_state(argv, cwd, env), _captured() as out:
        with _interrupted_after(timeout) as expired:
            code = _call(main, argv)
    if expired:
        raise subprocess.TimeoutExpired(["diagkit", *argv], timeout, output=out["stdout"],
                                        stderr=out["stderr"])
    return subprocess.CompletedProcess(["diagkit", *argv], code, out["stdout"], out["stderr"])


_WARM: list[bool] = []


def _warm_up(main) -> None:
    """Before this process's first call with `--timeout`: one whole check, its output dropped.
    A `--timeout` that expires while a call imports torch's pieces for the first time (about
    850 modules for a check; seconds under load) leaves them half imported in this worker, and
    every later call here fails ("Only a single TORCH_LIBRARY can be used...", "module 'sympy'
    has no attribute 'core'"); a real process would just have ended."""
    if _WARM:
        return
    _WARM.append(True)
    with _process_state(["check", "diagkit.demos:clean", "--steps", "1"], None, None), \
            _captured():
        _call(main, ["check", "diagkit.demos:clean", "--steps", "1"])


@contextlib.contextmanager
def _interrupted_after(timeout):
    """SIGINT to the main thread after `timeout` seconds, while the call runs: its handler
    (here, in the main thread) raises KeyboardInterrupt only while the call has not ended, so
    it can never land in pytest's code."""
    expired: list[bool] = []
    if timeout is None:
        yield expired
        return
    running = [True]

    def on_sigint(_signum, _frame):
        if running[0]:
            raise KeyboardInterrupt

    def expire():
        if running[0]:
            expired.append(True)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        yield expired
    finally:
        running[0] = False
        timer.cancel()
        timer.join()
        if expired:
            time.sleep(0.1)  # a SIGINT still on its way meets on_sigint, which ignores it
        signal.signal(signal.SIGINT, previous)  # _process_state puts it back too


def _call(main, argv: list[str]) -> int:
    """`sys.exit(main(argv))` as the console script does it, as an exit code."""
    try:
        return _exit_code(main(argv))
    except SystemExit as exc:
        return _exit_code(exc.code)
    except Exception:  # what escapes main (DIAGKIT_DEBUG=1): the interpreter's traceback
        traceback.print_exc(file=sys.stderr)
        return 1


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


# ------------------------------------------------------------------ the output
def _stream(fd: int, errors: str):
    base = sys.__stdout__ if fd == 1 else sys.__stderr__
    encoding = getattr(base, "encoding", None) or "utf-8"
    binary = open(fd, "wb", closefd=False)  # noqa: SIM115 - dropped, never closed: fd stays
    return io.TextIOWrapper(binary, encoding=encoding, errors=errors,
                                          line_buffering=True)


def _text(data: bytes) -> str:
    """As `subprocess.run(..., text=True)` decodes a pipe."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _flush(*streams) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def _captured():
    """fds 1 and 2 into files of their own, with fresh sys.stdout / sys.stderr on them."""
    out: dict[str, str] = {}
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    _flush(sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    saved_fds = [os.dup(1), os.dup(2)]
    saved_streams = sys.stdout, sys.stderr
    try:
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        out_errors = getattr(sys.__stdout__, "errors", None) or "strict"
        sys.stdout, sys.stderr = _stream(1, out_errors), _stream(2, "backslashreplace")
        try:
            yield out
        finally:
            _flush(sys.stdout, sys.stderr)
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        for name, file in zip(("stdout", "stderr"), files):
            file.seek(0)
            out[name] = _text(file.read())
            file.close()


# ------------------------------------------------------------------ the process's state
def _show_warning(msg) -> None:
    """The interpreter's own display of a warning (pytest records them instead)."""
    file = msg.file if msg.file is not None else sys.stderr
    with contextlib.suppress(OSError, AttributeError):
        file.write(warnings._formatwarnmsg(msg))


@contextlib.contextmanager
def _warnings_as_a_process():
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category, module in _DEFAULT_FILTERS:
            warnings.filterwarnings(action, category=category, module=module, append=True)
        warnings.showwarning = warnings._showwarning_orig
        warnings._showwarnmsg_impl = _show_warning
        yield


@contextlib.contextmanager
def _logging_as_a_process():
    """No handler on the root logger (WARNING and above go to sys.stderr through logging's
    last resort, as in a process that configured none); every logger put back afterwards."""
    manager = logging.Logger.manager
    loggers = [logging.root, *(lg for lg in list(manager.loggerDict.values())
                               if isinstance(lg, logging.Logger))]
    saved = [(lg, lg.level, lg.disabled, lg.propagate, list(lg.handlers)) for lg in loggers]
    disabled_level = manager.disable
    logging.root.handlers = []
    logging.root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    try:
        yield
    finally:
        for lg, level, disabled, propagate, handlers in saved:
            lg.setLevel(level)
            lg.disabled, lg.propagate, lg.handlers = disabled, propagate, handlers
        logging.disable(disabled_level)


def _handlers() -> dict:
    found = {}
    for signum in signal.valid_signals():
        with contextlib.suppress(ValueError, OSError):
            handler = signal.getsignal(signum)
            if handler is not None:  # None: set outside Python, cannot be put back
                found[signum] = handler
    return found


def _ours(module) -> bool:
    """A module a call imported that a new process would not have kept: one from outside the
    repository and the interpreter's folders (a file target, its sibling modules)."""
    file = getattr(module, "__file__", None)
    return bool(file) and _outside(file)


@functools.lru_cache(maxsize=None)
def _kept_folders() -> tuple[str, ...]:
    return tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
                 | {str(REPO)})


@functools.lru_cache(maxsize=None)
def _outside(file: str) -> bool:
    """Cached: every call looks at each of ~1,100 modules twice (realpath on each was 0.2 CPU s
    a call). A file target's path is written once per test folder, so the cache stays exact."""
    path = os.path.realpath(file)
    return not any(path == k or path.startswith(k + os.sep) for k in _kept_folders())


@contextlib.contextmanager
def _process_state(argv: list[str], cwd, env):
    cwd_before = os.getcwd()
    env_before = dict(os.environ)
    argv_before, path_before = sys.argv, sys.path[:]
    # Modules another test imported from its own folder (a `helpers` left by a test that
    # loaded a target itself) would shadow this call's siblings: a new process has none of them.
    hidden = {name: module for name, module in list(sys.modules.items()) if _ours(module)}
    for name in hidden:
        sys.modules.pop(name, None)
    modules_before = set(sys.modules)
    handlers_before = _handlers()
    try:
        if cwd is not None:
            os.chdir(cwd)
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        sys.argv = [DIAGKIT, *argv]
        importlib.invalidate_caches()  # a target file written just now is found
        with _warnings_as_a_process(), _logging_as_a_process():
            yield
    finally:
        for signum, handler in handlers_before.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(signum) is not handler:
                    signal.signal(signum, handler)
        for name in set(sys.modules) - modules_before:
            if _ours(sys.modules.get(name)):
                sys.modules.pop(name, None)
        sys.modules.update(hidden)
        sys.argv = argv_before  # the list itself, untouched
        sys.path[:] = path_before
        for key in set(os.environ) - set(env_before):
            del os.environ[key]
        for key, value in env_before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        os.chdir(cwd_before)
