"""`diagkit.explore`: the explorer in any notebook, on a diagnosis in memory or a saved folder
(docs/workbook.md, "The explorer anywhere").

    diagkit.explore(w.diagnosis)        # a result in memory
    diagkit.explore("diag/")            # a saved one, or one a running job is still writing

A folder that a whole-run watch is still writing (`meta["ended"] == "running"`) opens as it was
last saved, with a reload button: each save replaces the folder atomically, so a reader sees
one complete save or the next, and a read that meets the swap is tried again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..core.errors import DiagkitError
from ..core.result import load

TRIES = 3  # reads of a folder being replaced at that moment


def explore(diagnosis_or_folder, top: int = 6):
    """An interactive explorer (ipywidgets) of a `Diagnosis`, or of the diagnosis saved in a
    folder; `top`: how many problem tensors are picked at first."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise DiagkitError(f"top must be a positive integer, got {top!r}")
    from ..present.explorer import Reloadable
    from ..present.explorer import explore as view
    if isinstance(diagnosis_or_folder, (str, os.PathLike)):
        folder = Path(diagnosis_or_folder)
        diag = read(folder)
        if (diag.meta or {}).get("ended") != "running":
            return view(diag, top)

        def reload():
            again = read(folder)
            return view(again, top), _saved_line(again)
        return Reloadable(reload, view(diag, top), _saved_line(diag))
    if not all(hasattr(diagnosis_or_folder, a) for a in ("params", "steps")):
        raise DiagkitError("explore takes a Diagnosis (diagkit.load, Watch.diagnosis) or the "
                           f"folder one was saved to, got {type(diagnosis_or_folder).__name__}")
    return view(diagnosis_or_folder, top)


def read(folder: Path):
    """`load(folder)`, tried again when a save replaced the folder during the read."""
    if not folder.exists():
        raise DiagkitError(f"saved diagnosis {folder} does not exist")
    for attempt in range(TRIES):
        try:
            return load(folder)
        except DiagkitError:
            raise
        except (OSError, ValueError):  # a file gone, or half of one, in the swap
            if attempt == TRIES - 1:
                raise DiagkitError(f"saved diagnosis {folder} could not be read: it was "
                                   f"replaced {TRIES} times while being read") from None
            time.sleep(0.2)


def _saved_line(diag) -> str:
    observed = (diag.meta or {}).get("steps_observed", 0)
    if (diag.meta or {}).get("ended") != "running":
        return f"The job has ended: its diagnosis ({observed} observed steps)."
    return (f"A running job's diagnosis, as last saved ({observed} observed steps): "
            "reload for a newer save.")
