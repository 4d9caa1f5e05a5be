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
from pathlib import Path

from ..core.errors import DiagkitError
from ..core.result import load


def explore(diagnosis_or_folder, top: int = 6):
    """An interactive explorer (ipywidgets) of a `Diagnosis`, or of the diagnosis saved in a
    folder; `top`: how many problem tensors are picked at first."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise DiagkitError(f"top must be a positive integer, got {top!r}")
    from ..present.explorer import Reloadable
    from ..present.explorer import explore as view
    if isinstance(diagnosis_or_folder, (str, os.PathLike)):
        folder = Path(diagnosis_or_folder)
        diag = load(folder)  # one save whole; damage in one line (core.saved)
        if (diag.meta or {}).get("ended") != "running":
            return view(diag, top)

        def reload():
            again = load(folder)
            return view(again, top), _saved_line(again)
        return Reloadable(reload, view(diag, top), _saved_line(diag))
    if not all(hasattr(diagnosis_or_folder, a) for a in ("params", "steps")):
        raise DiagkitError("explore takes a Diagnosis (diagkit.load, Watch.diagnosis) or the "
                           f"folder one was saved to, got {type(diagnosis_or_folder).__name__}")
    return view(diagnosis_or_folder, top)


def _saved_line(diag) -> str:
    observed = (diag.meta or {}).get("steps_observed", 0)
    if (diag.meta or {}).get("ended") != "running":
        return f"The job has ended: its diagnosis ({observed} observed steps)."
    return (f"A running job's diagnosis, as last saved ({observed} observed steps): "
            "reload for a newer save.")
