"""A folder replaced whole (a saved diagnosis): written beside its place, then swapped in, so
that a reader finds the old folder or the complete new one, and a save killed half-way is
put right by the next save or read (docs/result.md, "Saved folders").

The folders beside `NAME`, hidden, and what each means when found:

- `.NAME.tmp-X`: being written (a save killed while writing leaves it; nothing reads it);
- `.NAME.new-X`: written completely, about to be swapped in;
- `.NAME.old-X`: the folder a swap moved aside, about to be removed.

A swap renames `NAME` to `.NAME.old-X`, then `.NAME.new-X` to `NAME`. SIGKILL between the two
renames leaves no `NAME`: `recover` (called by every save and every read) puts the complete new
folder in its place, or the old one when there is no new one.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from .modes import shared_mode
from .paths import real_path

SCRATCH, READY, OLD = "tmp", "new", "old"


def write_dir_atomic(target, write) -> Path:
    """Fill a scratch folder beside `target` with `write(folder)`, then swap it into place.
    Through a symbolic link, the folder it points to is replaced and the link stays. The
    folder gets the mode the umask gives a new folder."""
    given = Path(target)
    target = real_path(given, str(given))
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{SCRATCH}-", dir=target.parent))
    try:
        os.chmod(tmp, shared_mode(folder=True))
        write(tmp)
        ready = _beside(target, READY, tmp.name.rpartition("-")[2])
        os.replace(tmp, ready)
        tmp = ready
        _swap(ready, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return given


def _swap(ready: Path, target: Path) -> None:
    """`ready` into `target`'s place. An exception between the renames (Ctrl-C) puts the old
    folder back; a kill there is `recover`'s."""
    if not os.path.lexists(target):
        os.replace(ready, target)
        return
    old = _beside(target, OLD, ready.name.rpartition("-")[2])
    try:
        os.replace(target, old)
        try:
            os.replace(ready, target)
        except FileNotFoundError:  # a reader's `recover` swapped it in meanwhile
            if not os.path.lexists(target):
                raise
    finally:
        if not os.path.lexists(target) and os.path.lexists(old):
            os.replace(old, target)
    shutil.rmtree(old, ignore_errors=True)


def recover(target) -> None:
    """Put right what a save killed between its renames left: no `target`, and beside it the
    complete new folder (swapped in) or only the old one (put back). Folders moved aside by
    earlier swaps are removed once `target` is there. A save still writing, or about to swap,
    is left alone: its folders are `.tmp-` ones, or `.new-` ones while `target` exists."""
    target = Path(os.path.realpath(target))  # a link's leftovers are beside what it names
    try:
        names = os.listdir(target.parent)
    except OSError:  # no parent folder: nothing was saved there
        return
    found = {kind: _leftovers(target, names, kind) for kind in (READY, OLD)}
    if not os.path.lexists(target):
        for candidate in found[READY] + found[OLD]:  # newest first, the complete new first
            try:
                os.rename(candidate, target)
                break
            except FileNotFoundError:  # another reader (or the save itself) was faster
                continue
            except OSError:  # `target` appeared meanwhile (a non-empty folder)
                break
    if os.path.lexists(target):
        for old in found[OLD]:
            shutil.rmtree(old, ignore_errors=True)


def _leftovers(target: Path, names: list[str], kind: str) -> list[Path]:
    """The folders of `kind` beside `target`, newest first."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{kind}-[A-Za-z0-9_]+")
    paths = [target.parent / n for n in names if pattern.fullmatch(n)]
    return sorted((p for p in paths if p.is_dir() and not p.is_symlink()),
                  key=_mtime, reverse=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _beside(target: Path, kind: str, tag: str) -> Path:
    return target.with_name(f".{target.name}.{kind}-{tag}")
