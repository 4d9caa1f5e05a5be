"""Running: the orchestration on top, in rooms (docs/development.md, "Layout"): `target` (what
to run and its bounds), `diagnose` (running and judging a target's steps, in one process or on
ranks), `trackers` (report_to), `live` (the live view), `workbook` (the notebooks, the report,
compare, explore), `watch` (`diagkit.watch`) and `cli` (the console script).

`from diagkit.run import notebook` (and `compare`, `contract`) still works: the notebooks that
`diagkit notebooks DIR` copied before the rooms say it in their first cells, and a user's copy
must keep running. Those three names resolve, on first use, to their modules in `workbook`.
"""

import importlib

# a copied notebook's own imports (notebooks/*.ipynb before the rooms) -> the module now
_NOTEBOOK_IMPORTS = {"notebook": ".workbook.notebook", "compare": ".workbook.compare",
                     "contract": ".workbook.contract"}


def __getattr__(name: str):
    """A name a copied notebook imports from here: its module in `workbook`."""
    if name not in _NOTEBOOK_IMPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(_NOTEBOOK_IMPORTS[name], __name__)
