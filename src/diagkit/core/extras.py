"""What a feature outside the core needs installed, and the one line it says when that is missing
(README, "Install").

`pip install diagkit` is the core: it watches, judges, saves, prints and checks with torch and the
tables only, so that it fits a training image. The notebook side (the live view, the explorer,
the figures, `diagkit report`, `demo`, `notebooks`, `compare --out`) is the `workbook` extra. A
feature that needs a package of an extra asks `need` first, at its entry point; a module that
imports one at its top turns the failed import into the same line (`missing_error`). Either way
it is a `DiagkitError` (the CLI: one line, exit 2; a notebook: one line), never a bare
`ModuleNotFoundError`.
"""

from __future__ import annotations

import importlib.util

from .errors import DiagkitError

# What each feature of the workbook imports (top-level names, as `import` spells them).
REPORT = ("papermill", "nbconvert", "nbformat", "ipykernel", "matplotlib")  # a notebook executed
NOTEBOOKS = ("ipykernel", "matplotlib", "ipywidgets")  # the shipped notebooks, in a kernel
EXPLORER = ("IPython", "ipywidgets", "matplotlib")     # the explorer and the live view
FIGURES = ("matplotlib",)


def installed(module: str) -> bool:
    """Whether `module` (a top-level name) can be imported here: found on the path without
    importing it, so asking costs no import and changes nothing (ipywidgets imported outside a
    kernel replaces the `comm` package's factory for the whole process)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken entry in sys.modules counts as absent
        return False


def missing(modules) -> list[str]:
    """Those of `modules` that are not installed, in the order given."""
    return [m for m in modules if not installed(m)]


def need(modules, feature: str, extra: str = "workbook") -> None:
    """Raise one line naming `extra` when any of `modules` is not installed.

    `feature` is the words for what the user asked ("diagkit report", "diagkit.explore"): the
    line reads "diagkit report needs papermill and nbconvert: pip install 'diagkit[workbook]'".
    """
    absent = missing(modules)
    if absent:
        raise DiagkitError(needs_line(feature, absent, extra))


def missing_error(exc: ImportError, feature: str, extra: str = "workbook") -> DiagkitError:
    """The one line for an import of a module's top that failed (`exc`): raise it `from None`
    where the import was, so a notebook or the CLI shows the line, not the traceback."""
    name = (getattr(exc, "name", None) or str(exc)).split(".")[0]
    return DiagkitError(needs_line(feature, [name], extra))


def needs_line(feature: str, modules, extra: str) -> str:
    """"<feature> needs a, b and c: pip install 'diagkit[<extra>]'"."""
    names = list(modules)
    words = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{feature} needs {words}: pip install 'diagkit[{extra}]'"
