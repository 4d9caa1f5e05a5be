"""Writing outputs so that a reader sees the old file or the complete new one, never half (a
regular file is swapped in whole; a link is written through; a stream, a device or a FIFO is
written into, never replaced: `paths.file_target` says which), and checking before a run that
they can be written.

Strict JSON (NaN and infinities as null) and the tables' parquet form live here too, so every
writer of diagkit output shares them. Folders are swapped in by `swap`; a new file gets the
mode the umask gives (`modes`).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DiagkitError
from .modes import shared_mode
from .paths import file_target, lookup, real_path, reason
from .schema import TUPLE_COLUMNS

if TYPE_CHECKING:
    import pandas as pd


def check_replaceable_dir(target: Path, marker: str) -> None:
    """Refuse to replace anything but an empty folder or one we wrote (it holds `marker`). A
    symbolic link to such a folder is written through (the folder it points to is replaced;
    the link stays)."""
    target = Path(target)
    found = lookup(target, str(target))
    if found is None:
        return
    if not stat.S_ISDIR(found.st_mode):
        raise DiagkitError(f"{target} exists and is not a folder; choose another output folder")
    if any(target.iterdir()) and not (target / marker).is_file():
        raise DiagkitError(f"{target} is a non-empty folder that diagkit did not write "
                           f"(no {marker}); choose a new or empty folder")


def check_output_dir(target: Path, marker: str, label: str | None = None) -> None:
    """`check_replaceable_dir`, and the folder can be made: its first existing ancestor is a
    folder this process may write in (so a long run cannot end in a save that fails)."""
    target = Path(target)
    label = label or str(target)
    check_replaceable_dir(target, marker)
    ancestor = next((p for p in real_path(target, label).parents if p.exists()), None)
    if ancestor is not None and not ancestor.is_dir():
        raise DiagkitError(f"{target}: {ancestor} is not a folder; choose another output folder")
    why = None if ancestor is None else cannot_write_in(ancestor)
    if why:
        raise DiagkitError(f"{target}: cannot write in {ancestor} ({why}); choose another "
                           "output folder")


def cannot_write_in(folder: Path) -> str | None:
    """Why no file can be created in `folder`, or None. Tried for real, with a file created
    and removed at once: `os.access` says yes to root in a read-only folder, and to anyone on
    some mounts (sysfs) where the write then fails."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".diagkit-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(probe)
    return None


def check_output(path, option: str) -> None:
    """Before a (possibly long) run, not after it: `path`, given as `option` (`--json` a file;
    `--out` a report folder, created with its parents; `--save` a saved diagnosis) can be
    written, so the run cannot end in an output that fails."""
    if path is None:
        return
    target = Path(path)
    label = f"{option} {path}"
    if option == "--out":
        found = lookup(target, label)
        if found is not None and not stat.S_ISDIR(found.st_mode):
            raise DiagkitError(f"{label} exists and is not a folder")
        _check_ancestor(target, label)
        return
    if option == "--save":  # save replaces the folder: only one diagkit wrote, or an empty one
        lookup(target, label)  # a link loop: one line naming the option
        check_output_dir(target, marker="run.json", label=label)
        return
    how, where = file_target(target, label)
    if how == "stream":
        return
    if how == "into":
        if not os.access(where, os.W_OK):
            raise DiagkitError(f"{label}: permission denied")
        return
    parent = where.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise DiagkitError(f"{label}: folder {parent} {what}")
    why = cannot_write_in(parent)
    if why:
        raise DiagkitError(f"{label}: cannot write in {parent} ({why})")


def _check_ancestor(target: Path, label: str) -> None:
    """A report folder is filled through a scratch folder beside it: its first existing
    ancestor (where the scratch folder goes) and the folder itself, if it exists, must be
    folders this process can write in."""
    ancestor = next((p for p in real_path(target, label).parents if p.exists()), None)
    if ancestor is not None and not ancestor.is_dir():
        raise DiagkitError(f"{label}: {ancestor} is not a folder")
    for where in (ancestor, target if target.is_dir() else None):
        why = None if where is None else cannot_write_in(where)
        if why:
            raise DiagkitError(f"{label}: cannot write in {where} ({why})")


def json_text(payload) -> str:
    """Strict JSON text (see `to_jsonable`), as every diagkit JSON file holds it."""
    return json.dumps(to_jsonable(payload), indent=2, allow_nan=False)


def write_json_atomic(path, payload) -> None:
    """Strict JSON (see `to_jsonable`), written atomically."""
    write_text_atomic(path, json_text(payload))


def to_jsonable(obj):
    """Strict JSON: NaN and infinities become null, numpy scalars plain numbers. (numpy and
    pandas are imported here, once per call, not per element: the command line checks its
    outputs with this module before anything heavy is imported.)"""
    import numpy as np
    import pandas as pd

    def strict(obj):
        if isinstance(obj, dict):
            return {str(k): strict(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple, set, frozenset)):
            return [strict(v) for v in obj]
        if obj is None or obj is pd.NA:
            return None
        if isinstance(obj, (bool, np.bool_)):
            return bool(obj)
        if isinstance(obj, (int, np.integer)):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            return float(obj) if np.isfinite(obj) else None
        if isinstance(obj, str):
            return obj
        return str(obj)
    return strict(obj)


def records(df: pd.DataFrame) -> list[dict]:
    return to_jsonable(df.to_dict(orient="records"))


def to_parquet(df: pd.DataFrame, path: Path) -> None:
    """`df` as parquet (tuple columns as JSON text), converted on this thread alone.

    `DataFrame.to_parquet` lets pyarrow convert the columns on a `concurrent.futures` thread
    pool once a table has more than 100 rows per column (a watch of 800 tensors over 3 steps).
    A watch that ends with the process saves from an `atexit` callback, which runs after
    `threading` has shut that pool down ("cannot schedule new futures after interpreter
    shutdown"; Python 3.12 refuses any new thread there), so nothing here may start a Python
    thread. Arrow's own C++ threads, which write the file, are not Python threads.
    """
    import pyarrow as pa  # imported here: reading and writing parquet is rare
    import pyarrow.parquet as pq

    out = df.copy()
    for col in TUPLE_COLUMNS:
        if col in out:
            out[col] = out[col].map(lambda t: json.dumps(list(t)))
    pq.write_table(pa.Table.from_pandas(out, preserve_index=False, nthreads=1), path)


def from_parquet(path) -> pd.DataFrame:
    """A table written by `to_parquet` (a path or an open binary file), read on this thread.

    Arrow reads with its C++ thread pool by default. A process that read a table that way
    and then ended soon after (a CLI refusing a damaged folder with exit 2) was seen aborting
    at exit under load: "terminate called without an active exception", exit -6 instead of 2
    (apache/arrow#34314, #50482: pool teardown after reading from a Python file object).
    Our tables are small; one thread reads them as fast and leaves no pool behind.
    """
    import pyarrow.parquet as pq

    df = pq.read_table(path, use_threads=False, pre_buffer=False).to_pandas(use_threads=False)
    for col in TUPLE_COLUMNS:
        if col in df:
            df[col] = df[col].map(lambda s: _as_tuple(json.loads(s)))
    return df


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


def write_text_atomic(path, text: str, newline: str | None = None) -> None:
    """`text` into `path` as `file_target` says: a regular file through a temporary file
    beside it, swapped in when complete (keeping the mode of the file it replaces; a new one
    gets the umask's); a stream, a character device or a FIFO written into."""
    path = Path(path)
    how, where = file_target(path, str(path))
    if how != "swap":  # a stream (a terminal, a pipe) ends its last line
        _write_into(where, text if how == "into" or text.endswith("\n") else text + "\n",
                    newline, path)
        return
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(os.stat(where).st_mode) if where.is_file() else shared_mode(False)
        fd, tmp = tempfile.mkstemp(prefix=f".{where.name}.", dir=where.parent)
    except OSError as exc:  # a folder that became read-only, a full disk: the user's to fix
        raise DiagkitError(f"cannot write {path}: {reason(exc)}") from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", newline=newline, encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, where)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_into(where: Path | int, text: str, newline: str | None, path: Path) -> None:
    """Write a stream, a character device or a FIFO in place (a FIFO's open waits for its
    reader, as a shell's `>` does). What was printed before goes first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, or replaced by no stream
            pass
    try:
        with open(where, "w", newline=newline, encoding="utf-8", closefd=isinstance(where, Path)
                  ) as fh:
            fh.write(text)
    except OSError as exc:
        raise DiagkitError(f"cannot write {path}: {reason(exc)}") from None
