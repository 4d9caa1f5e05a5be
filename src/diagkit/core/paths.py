"""What a path is, looked up once through its links: nothing there, a folder, a regular file,
this process's own output stream, a device or a FIFO (and what a special one is called), and
where a write through it lands. Outputs (`files`) and inputs (`run.target.paths`,
`measure.checkpoints.kind`) ask here, so a link loop or an unreadable folder is the same one
line wherever the user's path is given.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import DiagkitError


def lookup(path: Path, label: str,
           absent: tuple = (FileNotFoundError, NotADirectoryError)) -> os.stat_result | None:
    """`os.stat(path)` through links; None when nothing is there (`absent`: or a link points
    nowhere, or a file stands where a folder should). The one place a user's path is looked
    up (outputs in `files`, inputs in `run.target.paths` and `measure.checkpoints.kind`). A
    link loop, an over-long name, a folder that may not be searched: the user's to fix, in one
    line (pathlib's `exists()` says False to a loop, and `resolve()` raises RuntimeError)."""
    try:
        return os.stat(path)
    except absent:
        return None
    except OSError as exc:
        raise DiagkitError(f"{label}: {reason(exc)}") from None


def reason(exc: OSError) -> str:
    """An OSError's cause as a person reads it."""
    if exc.errno == errno.ELOOP:
        return "symbolic link loop"
    return exc.strerror or type(exc).__name__


def real_path(path: Path, label: str) -> Path:
    """`path` with every symbolic link followed: where a write through it lands (a dangling
    link: the path it names). A loop is a DiagkitError naming `label`."""
    lookup(path, label)
    return Path(os.path.realpath(path))


def file_target(path: Path, label: str) -> tuple[str, Path | int]:
    """How an output file at `path` is written (docs/cli.md, "Command line"):

    - ("stream", fd): `path` is this process's standard output or error (`/dev/stdout`, or
      the file they are redirected to): written to that stream, after what was printed;
    - ("into", path): a character device (`/dev/null`) or a FIFO: opened and written, never
      replaced (a rename would put a regular file where /dev/null was);
    - ("swap", real path): a regular file, or none yet: written beside and renamed over it.
      Through a symbolic link, the file it points to is the one replaced; the link stays.

    Anything else there (a folder, a socket, a block device) is refused in one line. `-` is
    standard output (`check --json -`: docs/cli.md)."""
    if str(path) == "-":
        return "stream", 1
    found = lookup(path, label)
    if found is None:
        return "swap", real_path(path, label)
    for fd in (1, 2):
        try:
            if os.path.samestat(found, os.fstat(fd)):
                return "stream", fd
        except OSError:  # no such descriptor (a daemon)
            continue
    mode = found.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "into", path
    if stat.S_ISREG(mode):
        return "swap", real_path(path, label)
    if stat.S_ISDIR(mode):
        raise DiagkitError(f"{label} is a folder; give a file name")
    raise DiagkitError(f"{label} is {kind(mode)}; diagkit writes a regular file, a character "
                       "device or a FIFO")


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a path that is neither a regular file nor a folder is, as a person names it."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")
