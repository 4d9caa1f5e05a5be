"""`diagkit.explore`: the explorer in any notebook, on a diagnosis in memory or a saved folder
(docs/workbook.md, "The explorer anywhere").

    diagkit.explore(w.diagnosis)        # a result in memory
    diagkit.explore("diag/")            # a saved one, or one a running job is still writing

A folder that a whole-run watch is still writing (`meta["ended"] == "running"`) opens as it was
last saved, with a reload button: each save replaces the folder atomically, so a reader sees
one complete save or the next, and a read that meets the swap is tried again (`core.saved`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ...core import extras
from ...core.errors import DiagkitError
from ...core.result import load


def explore(diagnosis_or_folder, top: int = 6):
    """An interactive explorer (ipywidgets) of a `Diagnosis`, or of the diagnosis saved in a
    folder; `top`: how many problem tensors are picked at first. Without the workbook extra,
    one line saying to install it (README, "Install")."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise DiagkitError(f"top must be a positive integer, got {top!r}")
    extras.need(extras.EXPLORER, "diagkit.explore")
    from ...present.explorer import Reloadable
    from ...present.explorer import explore as view
    if isinstance(diagnosis_or_folder, (str, os.PathLike)):
        return _explore_folder(Path(diagnosis_or_folder), top, view, Reloadable)
    if not all(hasattr(diagnosis_or_folder, a) for a in ("params", "steps")):
        raise DiagkitError("explore takes a Diagnosis (diagkit.load, Watch.diagnosis) or the "
                           f"folder one was saved to, got {type(diagnosis_or_folder).__name__}")
    return view(diagnosis_or_folder, top)


def _explore_folder(folder: Path, top: int, view, reloadable):
    """The explorer of a saved folder; with a reload button while its job still runs. A
    reload that finds the save it shows says so, with the time of that save."""
    save = _save_of(folder)
    diag = load(folder)  # one save whole; damage in one line (core.saved)
    if (diag.meta or {}).get("ended") != "running":
        return view(diag, top)
    shown = {"save": save, "diag": diag}

    def reload():
        again_save = _save_of(folder)
        again = load(folder)
        if again_save == shown["save"]:
            return None, (f"Looked at {_clock(time.time())}: no newer save; this is still the "
                          f"save of {_clock(save_time(shown['save']))} "
                          f"({_observed(shown['diag'])} observed steps).")
        shown.update(save=again_save, diag=again)
        return view(again, top), _saved_line(again, again_save)
    return reloadable(reload, view(diag, top), _saved_line(diag, save))


def _save_of(folder: Path) -> tuple[int, int] | None:
    """Which save the folder holds now: its run.json's (inode, mtime in ns). Each save
    replaces the folder whole (`core.swap`), so a new save has a new run.json. Read before
    the folder is: a save that lands meanwhile is then seen as newer by the next reload."""
    try:
        st = (folder / "run.json").stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def save_time(save: tuple[int, int] | None) -> float | None:
    """The time a save was written (seconds since the epoch), None when unknown."""
    return None if save is None else save[1] / 1e9


def _clock(seconds: float | None) -> str:
    return "an unknown time" if seconds is None else time.strftime("%H:%M:%S",
                                                                 time.localtime(seconds))


def _observed(diag) -> int:
    return (diag.meta or {}).get("steps_observed", 0)


def _saved_line(diag, save) -> str:
    at = _clock(save_time(save))
    if (diag.meta or {}).get("ended") != "running":
        return (f"The job has ended: its diagnosis ({_observed(diag)} observed steps). "
                f"Saved at {at}.")
    return (f"A running job's diagnosis, as last saved ({_observed(diag)} observed steps) at "
            f"{at}: reload for a newer save.")
